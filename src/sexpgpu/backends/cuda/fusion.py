"""Fusion: which values a kernel recomputes instead of reading (asked in stage a), and which
launches share a kernel (stage b); docs/fusion.md, "The fusion planner and its budget", says why each rule.
Every decision is a `Decision` naming its rule, kept in the Schedule.

Values (STORE_RULES, asked by the lowering as it builds each value's expression, as
Inductor's lowering decides which pointwise values to realize: each answer needs the cost of
the expression built so far, its flops, depth and loads, which exists only there): a value is
inlined into the R kernels that read it (`KernelReaders`, counted from the graph alone) when
R is 1, or when recomputing costs at most the budget's flops a byte and loads no more bytes
than writing it once and reading it back (`recompute_rule`); it is written out when the graph
returns it, a reader needs it in memory, or a broadcast would repeat its arithmetic.
Kernels (JOINS, `fuse`, a pass over the lowering's unfused launches): a launch joins the
open kernel before it by the first rule that takes it, else starts a kernel of its own.
Layouts (LAYOUT_RULES): a lowering rule that lays a result out for its readers, or computes
one node beside another, records that too.

Fusion keeps every node's rounding (the inlined expression is the node's own; no multiply-add
is contracted), so it decides where a value is computed, never what it is.
SEXPGPU_OPTIMIZE=off writes every value out, joins nothing and captures no CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from sexpgpu import settings
from sexpgpu.backends.cuda import rowmerge
from sexpgpu.backends.cuda.views import VIEW_OPS
from sexpgpu.backends.cuda.codegen.columns import with_roots
from sexpgpu.backends.cuda.codegen.expr import flops, map_leaves, nodes_in_order
from sexpgpu.backends.cuda.codegen.space import contiguous
from sexpgpu.backends.cuda.launches import ITEM_BYTES, ColumnLaunch, FlatLaunch, loads_of

MAX_FLAT_OUTPUTS = 8
# A fused expression deeper than this is written out: a chain of thousands of elementwise ops
# becomes kernels of at most this many levels each. Comparing, hashing and rewriting an
# expression recurse through its levels, and each node keeps its own rounding, so the split
# changes no bits.
MAX_FUSED_DEPTH = 32
BUDGET_FLOPS_PER_BYTE = 9.0
MAX_INLINE_NODES = 160  # a longer expression is written out, to bound compile time
MAX_RECOMPUTING_READERS = 8  # more kernel readers than this read the value back: each is a kernel to compile
BROADCAST_FLOPS = 2  # a value read broadcast to a larger shape is inlined only below this


@dataclass(frozen=True)
class FusionPolicy:
    """How the backend lowers, as the plan decided it (plan/choices.py): the fusion level,
    the recompute budget in flops a byte (BUDGET_FLOPS_PER_BYTE under --deterministic and by
    default), {ProductShape.key(): implementation} for float32 products (products.py;
    a shape not named is ordinary), {ConvolutionKey.key(): engine text} for
    convolutions (windows.py; one not named runs PyTorch's cuDNN call), and the names of
    cuDNN's native pattern graphs on (backends/cuda/patterns.py; pattern_launches.py)."""

    level: str = "on"
    budget: float = BUDGET_FLOPS_PER_BYTE
    products: dict = field(default_factory=dict, hash=False)
    convolutions: dict = field(default_factory=dict, hash=False)
    patterns: tuple = ()

    def __post_init__(self):
        if not (0 < self.budget < float("inf")):
            raise ValueError(f"a recompute budget must be a positive number of flops a byte, not {self.budget}")

    @property
    def fuses(self) -> bool:
        return self.level == "on"


def policy_from_environment() -> FusionPolicy:
    """The policy of SEXPGPU_OPTIMIZE, before the plan's choices (CudaBackend.take_choices)."""
    return FusionPolicy(settings.value("SEXPGPU_OPTIMIZE") or "on")


class KernelReaders:
    """How many kernels evaluate an inlined node: its readers, where a movement op, or an
    elementwise reader (`inlinable(reader)`) that is itself inlined, stands for its own kernel
    readers, and a graph output is one more. An elementwise reader counts as one kernel when
    it will surely be written out: it has more than MAX_RECOMPUTING_READERS kernel readers,
    or more than one and (`writes_out`) the value it reads already costs more than the
    budget allows it. Row reductions that later share a kernel count apart (errs towards
    writing out)."""

    def __init__(self, graph, inlinable):
        self.consumers = graph.consumers()
        self.outputs = set(graph.outputs.values())
        self.inlinable = inlinable
        self.sinks: dict = {}
        for node in reversed(graph.nodes):
            self.sinks[node] = self._sinks(node, lambda reader: False)

    def count(self, node, writes_out=lambda reader: False) -> int:
        """Kernels evaluating `node`; `writes_out(reader)` says which elementwise readers
        the caller knows will be written out."""
        return len(self._sinks(node, writes_out))

    def _sinks(self, node, writes_out) -> set:
        found = {("output", node)} if node in self.outputs else set()
        for reader in self.consumers[node]:
            found |= self.sinks[reader] if self._passes(reader, writes_out) else {reader}
        return found

    def _passes(self, reader, writes_out) -> bool:
        if reader.op in VIEW_OPS:
            return True
        if not self.inlinable(reader) or reader in self.outputs:
            return False
        readers = len(self.sinks[reader])
        return readers <= MAX_RECOMPUTING_READERS and not (readers > 1 and writes_out(reader))


def loaded_bytes(value, size: int, item_bytes) -> float:
    """Bytes the expression loads per element of a value of `size` elements: each distinct
    load, the distinct elements its view reads (a stride-0 axis reads one) times the item
    size of its buffer (`item_bytes(key)`)."""
    total = 0.0
    size = max(int(size), 1)
    for node in nodes_in_order([value]):
        if node.op == "load":
            key, view = node.attr
            distinct = 1
            for dim, stride in zip(view.dims, view.strides):
                distinct *= int(dim) if stride else 1
            total += item_bytes(key) * min(distinct, size) / size
        elif node.op == "scalar":
            total += item_bytes(node.attr) / size
    return total


def broadcastable(policy: FusionPolicy, value, source_size: int, target_size: int) -> bool:
    """Whether a reader that sees the value broadcast to more elements may inline it: a
    broadcast repeats the value's arithmetic for every copy, so only a value that costs
    (almost) nothing is inlined so; any other is written out at its own size first."""
    return target_size <= source_size or flops([value]) <= BROADCAST_FLOPS


# The rules that decide whether a value is inlined into the kernels that read it (True) or
# written out once (False), by name: every Decision about a value names one of them.
STORE_RULES = {
    "the graph returns it": False,
    "deeper than MAX_FUSED_DEPTH": False,
    "a broadcast would repeat its arithmetic": False,
    "a reader needs it in memory": False,
    "a reader needs a view of it in memory": False,
    "no view of its loads gives the reader's view": False,
    "fusion is off": False,
    "longer than MAX_INLINE_NODES": False,
    "it costs no flops": True,
    "more kernel readers than MAX_RECOMPUTING_READERS": False,
    "one kernel reads it": True,
    "over the recompute budget": False,
    "recomputing loads no more bytes than reading back": True,
    "reading back loads fewer bytes": False,
}


# The rules by which a lowering rule lays a result out for, or computes it beside, another node;
# True: a kernel or a copy is saved.
LAYOUT_RULES = {
    "every reader merges its heads back: written merged, the merge a view": True,
    "the loss kernel gives it beside the loss": True,
}


def recompute_rule(policy: FusionPolicy, value, readers: int, itemsize: int, loads: float = 0.0) -> str:
    """The rule of STORE_RULES that decides whether each of `readers` kernels recomputes this
    value's expression, which loads `loads` bytes per element, rather than read it back."""
    if not policy.fuses:
        return "fusion is off"
    if len(nodes_in_order([value])) > MAX_INLINE_NODES:
        return "longer than MAX_INLINE_NODES"
    cost = flops([value])
    if cost == 0:  # a constant or a view: nothing to recompute
        return "it costs no flops"
    if readers > MAX_RECOMPUTING_READERS:
        return "more kernel readers than MAX_RECOMPUTING_READERS"
    if readers <= 1:
        return "one kernel reads it"
    if cost > policy.budget * itemsize:
        return "over the recompute budget"
    if readers * loads <= loads + itemsize + readers * itemsize:
        return "recomputing loads no more bytes than reading back"
    return "reading back loads fewer bytes"


def store_rule(policy: FusionPolicy, readers: KernelReaders, node, value, buffers: dict) -> str:
    """The rule of STORE_RULES that decides whether `node`'s value, the expression `value`
    over `buffers`, is written out or inlined into its readers."""
    if node in readers.outputs:
        return "the graph returns it"
    if value.depth > MAX_FUSED_DEPTH:
        return "deeper than MAX_FUSED_DEPTH"
    cost = flops([value])
    count = readers.count(node, lambda reader: cost > policy.budget * ITEM_BYTES[reader.dtype])
    loads = loaded_bytes(value, node.size, lambda key: ITEM_BYTES[buffers[key].dtype])
    return recompute_rule(policy, value, count, ITEM_BYTES[node.dtype], loads)


def recomputing(value, written: dict):
    """`value` with each load of a key of `written` {key: (view, expression)}, through the
    view that key was written with, replaced by the expression written there."""
    def own(leaf):
        if leaf.op == "load" and leaf.attr[0] in written and leaf.attr[1] == written[leaf.attr[0]][0]:
            return written[leaf.attr[0]][1]
        return leaf

    return map_leaves(value, own)


def add_output(launch: FlatLaunch, shape, key: str, dtype: str, value) -> FlatLaunch | None:
    """The open elementwise kernel `launch` with `value` as one more output, or None when it
    cannot take it. Legal when it is of the same space, has fewer than MAX_FLAT_OUTPUTS outputs, and
    `value` reads none of its outputs through another view or as a scalar: a read of an
    output through its own view becomes the output's expression (the kernel recomputes it
    rather than read what it writes), unless that makes it deeper than MAX_FUSED_DEPTH."""
    if launch.shape != shape or len(launch.outputs) >= MAX_FLAT_OUTPUTS:
        return None
    written = {key: (view, expression) for key, view, _, expression in launch.outputs}
    for node in nodes_in_order([value]):
        if node.op == "load" and node.attr[0] in written and node.attr[1] != written[node.attr[0]][0]:
            return None
        if node.op == "scalar" and node.attr in written:
            return None
    substituted = recomputing(value, written)
    if substituted.depth > MAX_FUSED_DEPTH:
        return None
    return replace(launch, outputs=launch.outputs + [(key, contiguous(shape), dtype, substituted)])


# --- the fusion pass (stage b): which launches share a kernel -------------------------------


@dataclass(frozen=True)
class Decision:
    """One decision of the fusion pass, as plain data: the value or launch it is about,
    the named rule that decided it, and whether it fused (inlined, or joined the kernel
    before it) or stayed apart (written out, or a kernel of its own)."""

    subject: str
    rule: str
    fused: bool

    def __str__(self) -> str:
        return f"{'fuse' if self.fused else 'apart'} {self.subject}: {self.rule}"


def _store(launch):
    """(shape, key, dtype, value) of a launch that writes one elementwise value, else None."""
    if isinstance(launch, FlatLaunch) and len(launch.outputs) == 1:
        (key, _, dtype, value), = launch.outputs
        return launch.shape, key, dtype, value
    return None


def add_tile_output(launch: ColumnLaunch, store: FlatLaunch) -> ColumnLaunch | None:
    """The open column kernel with the elementwise kernel `store` (one value) stored tile by
    tile, where the value is of the kernel's space and reads what the kernel reads (so its
    operands are read once for both), and reads nothing the kernel writes; else None."""
    (key, view, dtype, value), = store.outputs
    value = recomputing(value, {name: (seen, expression) for name, seen, expression in launch.recomputed})
    spec = launch.spec
    loads = set(loads_of([value]))
    if (tuple(store.shape) != spec.space or not view.over(spec.space) or len(spec.tile_outputs) >= MAX_FLAT_OUTPUTS
            or not loads & set(launch.reads) or loads & set(launch.writes) or value.depth > MAX_FUSED_DEPTH):
        return None
    return with_tile_store(launch, spec, key, view, dtype, value)


def with_tile_store(launch: ColumnLaunch, spec, key: str, view, dtype: str, value) -> ColumnLaunch:
    """`launch` with the expressions of `spec` and `value` stored tile by tile as `key`."""
    joined = replace(spec, tile_outputs=spec.tile_outputs + ((view, dtype),),
                     tile_stores=spec.tile_stores + ((len(spec.tile_outputs), value),))
    return replace(launch, spec=joined, writes=launch.writes + (key,))


def take_producer(last: FlatLaunch, launch: ColumnLaunch) -> ColumnLaunch | None:
    """The column kernel `launch` with the one value of the elementwise kernel `last` before
    it as a tile store, computed where it would be read back: the value is of its space, read
    through the view it was written with and never as a scalar, and reads nothing the column
    kernel writes. The stores that join later read it so too (`ColumnLaunch.recomputed`);
    a tile store no kernel reads is dropped (`without_dead_stores`)."""
    (key, view, dtype, value), = last.outputs
    spec = launch.spec
    roots = launch.roots()
    if (tuple(last.shape) != spec.space or not view.over(spec.space) or key not in launch.reads
            or len(spec.tile_outputs) >= MAX_FLAT_OUTPUTS or set(loads_of([value])) & set(launch.writes)
            or any(node.op == "scalar" and node.attr == key for node in nodes_in_order(roots))):
        return None
    changed = [recomputing(root, {key: (view, value)}) for root in roots]
    if key in loads_of(changed) or max(root.depth for root in changed) > MAX_FUSED_DEPTH:
        return None
    joined = with_tile_store(launch, with_roots(spec, changed, spec.inputs), key, view, dtype, value)
    return replace(joined, recomputed=launch.recomputed + ((key, view, value),))


class Join(NamedTuple):
    """A rule by which a launch joins the open kernel before it."""

    applies: object  # applies(last, launch): whether the rule is about kernels of these kinds
    join: object  # join(last, launch): the joined kernel, or None where joining would change a bit


# The rules, tried in order (their conditions are rowmerge.add_store's, add_output's,
# add_tile_output's and rowmerge.merged's).
JOINS = {
    "a store joins the open row kernel":
        Join(lambda last, launch: _store(launch) and rowmerge.joinable(last),
             lambda last, launch: rowmerge.add_store(last, *_store(launch))),
    "a store joins the open elementwise kernel of its space":
        Join(lambda last, launch: _store(launch) and isinstance(last, FlatLaunch),
             lambda last, launch: add_output(last, *_store(launch))),
    "a store joins the open column kernel of its space, reading its operands":
        Join(lambda last, launch: _store(launch) and isinstance(last, ColumnLaunch), add_tile_output),
    "a row kernel joins the row kernel over the same rows before it":
        Join(lambda last, launch: rowmerge.joinable(last) and rowmerge.joinable(launch), rowmerge.merged),
    "an elementwise kernel's value joins the column kernel after it that reads it":
        Join(lambda last, launch: isinstance(last, FlatLaunch) and len(last.outputs) == 1
             and isinstance(launch, ColumnLaunch), take_producer),
}


PAST_RULE = "a store joins the elementwise kernel of its space before an independent one, which runs first"


def join_past(before, between, launch) -> list | None:
    """[between, before joined by the store `launch`], where `between` is an elementwise
    kernel that neither reads what `before` writes nor writes what it reads or writes, so
    that it may run first; else None. AdamW's parameter update so joins the kernel of its
    moments past the kernel of the step's bias corrections it reads, and recomputes the new
    moments instead of reading them back."""
    if not (_store(launch) and isinstance(before, FlatLaunch) and isinstance(between, FlatLaunch)):
        return None
    if set(between.writes) & set(before.reads + before.writes) or set(between.reads) & set(before.writes):
        return None
    joined = add_output(before, *_store(launch))
    return None if joined is None else [between, joined]


def fuse(launches: list, buffers: dict, policy: FusionPolicy) -> tuple[list, list]:
    """Stage (b)'s joins: (the kernels, the Decisions). Each launch in order joins the
    kernel before it by the first rule of JOINS that takes it, or the one before that
    (`join_past`), else starts a kernel of its own (the decision names the rules that
    applied and refused); then the stores no kernel reads are dropped (`without_dead_stores`)."""
    kernels, decisions = [], []
    for index, launch in enumerate(launches):
        last = kernels[-1] if policy.fuses and kernels else None
        subject = f"launch {index} {launch.kind} -> {','.join(launch.writes)}"
        refused = []
        for rule, (applies, join) in JOINS.items():
            joined = join(last, launch) if last is not None and applies(last, launch) else False
            if joined:
                kernels[-1] = joined
                decisions.append(Decision(subject, rule, True))
                break
            if joined is None:
                refused.append(rule)
        else:
            past = join_past(kernels[-2], last, launch) if last is not None and len(kernels) > 1 else None
            if past:
                kernels[-2:] = past
                decisions.append(Decision(subject, PAST_RULE, True))
                continue
            kernels.append(launch)
            why = f"refused by: {'; '.join(refused)}" if refused else "no rule joins kernels of these kinds"
            why = why if policy.fuses else "fusion is off"
            decisions.append(Decision(subject, why, False))
    return without_dead_stores(kernels, buffers, decisions), decisions


def without_dead_stores(kernels: list, buffers: dict, decisions: list) -> list:
    """The kernels with the stores that no kernel reads taken out. A value is written out
    when the fusion planner counts several kernels evaluating it; when its one reader then
    joined the same kernel (which recomputes it by substitution), the store is left with no
    reader. Dropping it changes no value, only the bytes written."""
    read = {key for kernel in kernels for key in kernel.reads}

    def live(key) -> bool:
        if key in read or buffers[key].kind != "arena":
            return True
        decisions.append(Decision(f"store {key}", "a store no kernel reads is dropped", True))
        return False

    kept = []
    for kernel in kernels:
        if isinstance(kernel, FlatLaunch):
            kernel = replace(kernel, outputs=[output for output in kernel.outputs if live(output[0])])
            if not kernel.outputs:
                continue
        elif isinstance(kernel, ColumnLaunch):
            kernel = live_tile_stores(kernel, live)
        kept.append(kernel)
    return kept


def live_tile_stores(kernel: ColumnLaunch, live) -> ColumnLaunch:
    """The column kernel without the tile stores whose key is not `live(key)`."""
    spec, first = kernel.spec, len(kernel.spec.outputs)
    keys = kernel.writes[first:]
    kept = [number for number, key in enumerate(keys) if live(key)]
    if len(kept) == len(keys):
        return kernel
    renumbered = {number: place for place, number in enumerate(kept)}
    spec = replace(spec, tile_outputs=tuple(spec.tile_outputs[number] for number in kept),
                   tile_stores=tuple((renumbered[number], value) for number, value in spec.tile_stores
                                     if number in renumbered))
    return replace(kernel, spec=spec, writes=kernel.writes[:first] + tuple(keys[number] for number in kept))
