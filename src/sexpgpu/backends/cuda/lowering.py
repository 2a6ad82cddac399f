"""A graph to the launches that run it on the GPU, in stages over plain data.

(a) `Lowerer.schedule()` walks the graph's nodes in order and makes one launch per op
(`Schedule.unfused`), giving each node a value: a kernel expression over its shape
(codegen/expr.py). An input is a load of its buffer; a movement op changes its source's
loads' views (views.py); an elementwise op combines its inputs' expressions (elementwise.py),
and is written out (an elementwise launch) only where a rule of fusion.STORE_RULES says
so. Reductions, normalisations and the loss are row or column launches inlining their
input's expression (reductions.py); products, gathers, pads, windows, attention and draws
are launches of their own, each kind a RuleTable (`LAUNCH_RULES`); a group of nodes one of
cuDNN's native pattern graphs computes is one launch (pattern_launches.py).
(b) fusion.fuse joins neighbouring launches into kernels by the named rules of
fusion.JOINS; the `Schedule` holds the kernels and every decision as data, and no Triton.
(c) `arena_plan`: every arena buffer's offset, from plan/memory.py's liveness and arena.
(d) `generate`: each kernel's Triton source (codegen/), the `Lowered` launches the runtime runs.
`lower` runs them in order.

What this decides depends only on the graph, the shapes, SEXPGPU_OPTIMIZE and the plan's
choices, never on timing; with patterns on, also on which groups cuDNN builds plans for, a
fact of the device and its cuDNN.

An exact graph (graph/passes/exact_region.py: its nodes of dtype acc or marked exact) takes
exact.py's lowering for those nodes (`ExactLowering.of`).
"""

from __future__ import annotations

from sexpgpu.errors import SexpgpuError

from dataclasses import dataclass, field

from sexpgpu.backends.cuda import rowmerge, views
from sexpgpu.backends.cuda.attention import ATTENTION
from sexpgpu.backends.cuda.draws import DRAWS
from sexpgpu.backends.cuda.elementwise import EXPRESSIONS
from sexpgpu.backends.cuda.exact import ExactLowering
from sexpgpu.backends.cuda.gathers import GATHERS
from sexpgpu.backends.cuda.fusion import LAYOUT_RULES, STORE_RULES, Decision, FusionPolicy, KernelReaders, broadcastable, fuse
from sexpgpu.backends.cuda.fusion import store_rule
from sexpgpu.backends.cuda.codegen.expr import Expr, cast, load, scalar
from sexpgpu.backends.cuda.codegen.space import View, contiguous
from sexpgpu.backends.cuda.pads import PADS
from sexpgpu.backends.cuda.pattern_launches import Patterns
from sexpgpu.backends.cuda.placement import in_place
from sexpgpu.backends.cuda.products import PRODUCTS
from sexpgpu.backends.cuda.reductions import REDUCTIONS
from sexpgpu.backends.cuda.windows import WINDOWS
from sexpgpu.backends.cuda.launches import Buffer, ColumnLaunch, FlatLaunch, Operand, TorchLaunch, launch_text, same_memory
from sexpgpu.backends.cuda.launches import reads_of, strided
from sexpgpu.exact.layout import WIDTH
from sexpgpu.plan.memory import ArenaPlan, liveness, plan_arena

# Ops whose bf16 result needs no rounding: it is one of their bf16 inputs, or exact.
_EXACT_IN_BF16 = ("neg", "relu", "where", "maximum", "minimum", "cast", "const")


@dataclass
class Schedule:
    """What lowering and fusion make (stages a and b): the kernels in order as plain data
    (FlatLaunch, RowLaunch and ColumnLaunch: expressions reading buffers by key; TorchLaunch: a
    PyTorch call), their buffers, the launches before fusion and its decisions; no Triton."""

    graph: object
    launches: list
    buffers: dict  # key -> Buffer
    inputs: dict  # graph input name -> buffer key
    outputs: dict  # graph output name -> buffer key
    patterns: tuple = ()  # backends/cuda/patterns.py's PatternUse of each match met
    covered: frozenset = frozenset()  # the nodes cuDNN's pattern graphs compute
    unfused: tuple = ()  # the launches lowering made, before the fusion pass joined them
    decisions: tuple = ()  # fusion.Decision of each: what was fused, by which rule

    def dump(self) -> str:
        buffers = [f"{key} {b.kind} {b.dtype}{list(b.shape)}" for key, b in self.buffers.items()]
        launches = [f"launch {index}: {launch_text(launch)}" for index, launch in enumerate(self.launches)]
        return "\n".join(buffers + launches + [str(decision) for decision in self.decisions])


@dataclass
class Lowered(Schedule):
    """The schedule after the memory plan and code generation: the launches the runtime runs."""

    offsets: dict = field(default_factory=dict)  # arena buffer key -> byte offset
    arena_bytes: int = 0
    in_place: dict = field(default_factory=dict)  # result key -> the arena buffer it updates in place (placement.py)


# The tables whose rules `rule(lowerer, node)` emit launches of their own, one module per kind
LAUNCH_RULES = {op: rule for table in (REDUCTIONS, PRODUCTS, GATHERS, PADS, WINDOWS, ATTENTION, DRAWS)
              for op, rule in table.items()}
GENERATED_LAUNCHES = (FlatLaunch, rowmerge.RowLaunch, ColumnLaunch)  # launches whose code generation makes a Triton kernel
ARENA_ALIGNMENT = 256


class Lowerer:
    def __init__(self, graph, policy: FusionPolicy):
        self.graph = graph
        self.policy = policy
        self.readers = KernelReaders(graph, lambda node: node.op in EXPRESSIONS)
        self.values: dict = {}  # node -> Expr over node.shape
        self.accumulators: dict = {}  # node -> buffer key of its digits (exact graphs' gradient region)
        self.launches: list = []  # the launches, unfused, in order
        self.decisions: list = []  # fusion.Decision of each value: written out or inlined, by which rule
        self.index = {node: number for number, node in enumerate(graph.nodes)}
        self.buffers: dict = {}
        self.exact = ExactLowering.of(graph)  # None for a graph with no exact node
        self._output_of: dict = {}  # node -> buffer key for its first output name
        self.shared: dict = {}  # buffers launches hand one another beside the nodes' values (attention's statistics)
        # pattern graphs round as cuDNN does: an exact run sums every product itself
        self.patterns = Patterns(graph, () if self.exact is not None else policy.patterns)

    # --- buffers ------------------------------------------------------------------------------

    def new_buffer(self, dtype: str, shape, kind: str = "arena", values=()) -> str:
        key = f"b{len(self.buffers)}"
        self.buffers[key] = Buffer(key, dtype, tuple(int(size) for size in shape), kind, values=tuple(values))
        return key

    def constant_buffer(self, dtype: str, shape, values) -> str:
        """A buffer holding `values` (C order), put on the device once with the executable."""
        return self.new_buffer(dtype, shape, "constant", values)

    def result_buffer(self, node) -> str:
        """The buffer a node's result is written to: an output buffer when the graph
        returns it, else an arena buffer."""
        kind = "output" if node in self._output_nodes and node not in self._output_of else "arena"
        key = self.new_buffer(node.dtype, node.shape, kind)
        if kind == "output":
            self._output_of[node] = key
        return key

    def accumulator_buffer(self, node) -> str:
        """Where a gradient-region node's digits live (exact.py): an entry of the call's
        environment beside the arena, and the graph's output itself when it returns the node."""
        key = self.new_buffer("i64", (WIDTH,) + tuple(node.shape), "accumulator")
        self.accumulators[node] = key
        if node in self._output_nodes:
            self._output_of.setdefault(node, key)
        return key

    def loaded(self, node, key: str) -> Expr:
        if node.rank == 0:
            return scalar(key, node.dtype)
        return load(key, contiguous(node.shape), node.dtype)

    # --- reading values -----------------------------------------------------------------------

    def value_in(self, node, shape) -> Expr:
        """`node`'s value broadcast to `shape`."""
        self._before_broadcast(node, shape)
        return self.value_through(node, lambda view: views.broadcast(view, node.shape, shape))

    def _before_broadcast(self, node, shape) -> None:
        """Write `node` out first when a broadcast to `shape` would repeat its arithmetic."""
        size = 1
        for dim in shape:
            size *= int(dim)
        if not broadcastable(self.policy, self.values[node], node.size, size):
            self.realize(node, "a broadcast would repeat its arithmetic")

    def addressable(self, node) -> Operand:
        """The buffer and view over the node's own axes holding `node`, writing it out if its
        value is an expression or a view no strided tensor can express."""
        value = self.values[node]
        if value.op == "load" and value.attr[1].over(node.shape):
            return Operand(*value.attr)
        if value.op == "scalar":
            return Operand(value.attr, View((), (), 0))
        if self._realize_under_view(node):
            return self.addressable(node)
        self.realize(node, "a reader needs it in memory")
        return self.addressable(node)

    def operands(self, nodes) -> list[Operand]:
        return [self.addressable(node) for node in nodes]

    def _realize_under_view(self, node) -> bool:
        """A reshape or transpose of a computed value is written out as that value, in the
        value's own shape, and read back through the view: readers that see it through
        different views (a gradient read whole and flattened) then share one write."""
        source = node
        while source.op in ("reshape", "transpose") and source not in self._output_nodes:
            source = source.inputs[0]
        if source is node or source.rank == 0 or self.values[source].op in ("load", "scalar"):
            return False
        self.realize(source, "a reader needs a view of it in memory")
        self._view_again(node, source)
        return True

    def _view_again(self, node, source) -> None:
        """Recompute the views from `source` up to `node` over `source`'s new value."""
        chain = []
        while node is not source:
            chain.append(node)
            node = node.inputs[0]
        for view in reversed(chain):
            self._view(view)

    def realize(self, node, rule: str) -> None:
        """Write `node`'s value out with an elementwise launch, as fusion.STORE_RULES'
        `rule` decides; it is read back after."""
        value = self.values[node]
        own = self._output_of.get(node)
        if (value.op == "load" and value.attr[0] == own) or (value.op == "scalar" and value.attr == own):
            return
        if value.op in ("load", "scalar") and node not in self._output_nodes:
            if value.op == "scalar" or value.attr[1].over(node.shape):
                return
        self.decide(node, rule)
        key = self.result_buffer(node)
        self.emit_elementwise(node.shape, key, node.dtype, value)
        self.values[node] = self.loaded(node, key)

    def decide(self, node, rule: str) -> None:
        """Record the decision about `node` by `rule`, one of fusion's STORE_RULES or LAYOUT_RULES."""
        fused = STORE_RULES[rule] if rule in STORE_RULES else LAYOUT_RULES[rule]
        self.decisions.append(Decision(f"%{self.index[node]} {node.op}", rule, fused))

    def emit_elementwise(self, shape, key: str, dtype: str, value: Expr) -> None:
        """Write `value` to `key`: a launch of its own, which the fusion pass may join
        to the kernel before it (fusion.fuse)."""
        self.launches.append(FlatLaunch(tuple(shape), [(key, contiguous(shape), dtype, value)]))

    # --- the walk -----------------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """Stages (a) and (b): the graph's kernels in order, as plain data."""
        self._output_nodes = set(self.graph.outputs.values())
        inputs = {}
        for name, node in self.graph.inputs.items():
            key = self.new_buffer(node.dtype, node.shape, "input")
            inputs[name] = key
            self.values[node] = self.loaded(node, key)
        for node in self.graph.nodes:
            if self.patterns.skip(self, node):  # computed by a pattern's launch, which runs at its last such node
                continue
            if node.op == "input" or node in self.values:  # inputs, and values an earlier kernel wrote beside its own
                continue
            exact = self.exact.lowering(node) if self.exact is not None else None
            if exact is not None:
                exact(self, node)
                continue
            if self.patterns.take(self, node):
                continue
            if node.op in views.VIEWS:
                self._view(node)
            elif node.op in EXPRESSIONS:
                self._elementwise(node)
            elif node.op in LAUNCH_RULES:
                LAUNCH_RULES[node.op](self, node)
            else:
                raise SexpgpuError("E-DEVICE-002", f"the CUDA backend has no lowering for the op '{node.op}'.",
                                   node.loc, hint="Run this file with --device cpu.")
        if self.exact is not None:
            self.exact.finish(self)
        outputs = self._outputs()
        kernels, joins = fuse(self.launches, self.buffers, self.policy)
        return Schedule(self.graph, kernels, self.buffers, inputs, outputs, tuple(self.patterns.uses),
                        frozenset(self.patterns.covered), tuple(self.launches), tuple(self.decisions + joins))

    def emit_result(self, node, launch) -> None:
        """A launch that writes `node`'s result to its first buffer; the node's value reads it."""
        self.launches.append(launch)
        self.values[node] = self.loaded(node, launch.writes[0])

    def emit_torch(self, node, kind: str, write) -> None:
        """A PyTorch launch writing `node`'s result: write(its buffer, *its inputs as strided tensors)."""
        sources = self.operands(node.inputs)
        key = self.result_buffer(node)

        def run(env):
            write(env[key], *[source.strided(env) for source in sources])

        self.emit_result(node, TorchLaunch(run, reads_of(sources), (key,), kind))

    def value_through(self, node, change) -> Expr:
        """`node`'s value with `change` applied to its views, writing it out first when a
        view cannot take the change."""
        value = views.through(self.values[node], change)
        if value is None:
            self.realize(node, "no view of its loads gives the reader's view")
            value = views.through(self.values[node], change)
        return value

    def _elementwise(self, node) -> None:
        if node.op == "one_hot":
            (ids,) = node.inputs
            unit = ids.shape + (1,)
            args = [self.value_through(ids, lambda view: views.broadcast(views.reshape(view, ids.shape, unit), unit, node.shape))]
        else:
            args = [self.value_in(source, node.shape) for source in node.inputs]
        self.take_value(node, EXPRESSIONS[node.op](node, args))

    def take_value(self, node, value: Expr) -> None:
        """`value`, the node's float32 result, as the node's value: rounded to bf16 for a bf16
        node, and written out when the graph returns it or the fusion planner says so."""
        if node.dtype == "bf16" and node.op not in _EXACT_IN_BF16:
            value = cast(value, "bf16")
        self.values[node] = value
        rule = store_rule(self.policy, self.readers, node, value, self.buffers)
        if STORE_RULES[rule]:
            self.decide(node, rule)
        else:
            self.realize(node, rule)

    def _view(self, node) -> None:
        (source,) = node.inputs
        if node.op == "broadcast":
            self._before_broadcast(source, node.shape)
        value = self.value_through(source, views.VIEWS[node.op](node, source))
        if value is None:  # a view of a written-out value always works; this is a bug
            raise AssertionError(f"cannot view {source!r} as {node!r}")
        self.values[node] = value

    def _outputs(self) -> dict:
        outputs = {}
        for name, node in self.graph.outputs.items():
            key = self._output_of.get(node)
            if node in self.accumulators:  # digits made for this call: one object under each of its names
                outputs[name] = key
                continue
            if key is None or key in outputs.values():
                key = self.new_buffer(node.dtype, node.shape, "output")
                self._copy_out(node, key)
                self._output_of.setdefault(node, key)
            outputs[name] = key
        return outputs

    def _copy_out(self, node, key: str) -> None:
        """An output that is a view of a written-out value is copied by PyTorch (no kernel to
        generate for each offset); any other value is written by a fused kernel."""
        value = self.values[node]
        if value.op == "load" and value.attr[1].over(node.shape):
            source, view = value.attr
            aliases = ((key, source, view),) if self.buffers[source].kind == "arena" else ()
            self.launches.append(TorchLaunch(_copier(key, source, view), (source,), (key,), "copy", aliases=aliases))
            return
        self.emit_elementwise(node.shape, key, node.dtype, value)


def _copier(key: str, source: str, view: View):
    def run(env):
        value = strided(env, source, view)
        if not same_memory(env[key], value):  # an output placed where it is made (placement.py)
            env[key].copy_(value)

    return run


def lowered_ops() -> frozenset:
    """Every op the lowering handles: inputs, views, expressions, and the ops of the tables
    whose rules emit launches."""
    return frozenset(("input",)).union(views.VIEWS, EXPRESSIONS, LAUNCH_RULES)


# --- the stages after the schedule --------------------------------------------------------------


def arena_plan(schedule: Schedule) -> ArenaPlan:
    """Stage (c): the arena buffers' offsets, from the one liveness analysis (plan/memory.py).
    A buffer of placed inputs is held from the start, and to the end unless a kernel updates
    it in place (placement.in_place): then its result takes its memory at that kernel."""
    buffers = schedule.buffers
    takes = in_place(schedule)
    updated = set(takes.values())
    held = {key for key, buffer in buffers.items() if buffer.live_from_start}
    steps = [(launch.reads, launch.writes) for launch in schedule.launches]
    lives = liveness(steps, lambda key: buffers[key].nbytes, held - updated, from_start=held & updated)
    return plan_arena([life for life in lives if buffers[life.key].kind == "arena"], ARENA_ALIGNMENT, takes)


def generate(schedule: Schedule, arena: ArenaPlan) -> Lowered:
    """Stage (d): every kernel's Triton source (codegen/), the launches the runtime runs."""
    launches = [launch.finish(schedule.buffers) if isinstance(launch, GENERATED_LAUNCHES) else launch
                for launch in schedule.launches]
    used = {key for launch in launches for key in launch.reads + launch.writes}
    buffers = {key: buffer for key, buffer in schedule.buffers.items() if key in used or buffer.kind != "arena"}
    return Lowered(**{**vars(schedule), "launches": launches, "buffers": buffers}, offsets=arena.offsets,
                   arena_bytes=arena.arena_bytes, in_place=arena.takes)


def lower(graph, policy: FusionPolicy) -> Lowered:
    """The stages in order: lowering with fusion, the memory plan, code generation."""
    schedule = Lowerer(graph, policy).schedule()
    return generate(schedule, arena_plan(schedule))
