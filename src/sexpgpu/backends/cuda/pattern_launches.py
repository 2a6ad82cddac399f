"""The lowering's side of cuDNN's native pattern graphs: a group of nodes that a pattern on
matches (backends/cuda/patterns.py) becomes one launch running the first plan cuDNN offers for it
(cudnn_patterns.py), or, where cuDNN declines it, the ordinary launches of its nodes.

    patterns = Patterns(graph, policy.patterns)
    patterns.skip(lowerer, node)   # a node of a taken group: its launch runs at the group's `emit` node
    patterns.take(lowerer, node)   # the first node of a group: True when cuDNN's plan computes the group

The decision is made at the group's first node, where the operands the plan's layout
depends on are lowered (a product's two operands, attention's q, k, v); a bias the group
adds later is read as a contiguous tensor. Each operand is the lowering's buffer seen with
the plan's dims and strides (`Declared`): a view that folds into them is read in place, any
other (or a broadcast: cuDNN reads no zero strides) is copied contiguous at run time. Results
are written straight into their buffers: attention's dK and dV side by side in the one
buffer of attention_grad_kv; a result the graph has no node for goes to scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sexpgpu.backends.cuda import cudnn_engines
from sexpgpu.backends.cuda.codegen.space import View, contiguous_strides
from sexpgpu.backends.cuda.cudnn_patterns import Layout, PatternGraph, first_plan
from sexpgpu.backends.cuda.launches import TorchLaunch, strided
from sexpgpu.backends.cuda.views import reshape_strides
from sexpgpu.backends.cuda.patterns import PatternUse, match_patterns

STATS = "attention stats"  # Lowerer.shared key of a taken forward's statistics buffer


@dataclass(frozen=True)
class Declared:
    """A buffer as a pattern graph's operand: `layout`'s dims and strides at the view's
    offset, or (`copy`) the view copied contiguous first."""

    key: str
    view: View
    layout: Layout
    copy: bool = False

    def tensor(self, env):
        dims, strides = self.layout.dims, self.layout.strides
        if self.copy:
            value = strided(env, self.key, self.view).contiguous()
            return value.as_strided(dims, strides, value.storage_offset())
        base = env[self.key]
        return base.as_strided(dims, strides, base.storage_offset() + self.view.offset)


def _canonical(strides, dims) -> tuple:
    """Strides with those of size-1 axes made the contiguous ones (they address nothing)."""
    own = contiguous_strides(dims)
    return tuple(own[axis] if int(size) == 1 else int(stride) for axis, (size, stride) in enumerate(zip(dims, strides)))


def declare(key: str, view: View, dims, dtype: str) -> Declared:
    dims = tuple(int(size) for size in dims)
    strides = reshape_strides(view.dims, view.strides, dims)
    if strides is None or any(stride == 0 and size > 1 for size, stride in zip(dims, strides)):
        return Declared(key, view, Layout(dims, contiguous_strides(dims), dtype), copy=True)
    return Declared(key, view, Layout(dims, _canonical(strides, dims), dtype))


def operand(lowerer, node, dims) -> Declared:
    return declare(*lowerer.addressable(node), dims, node.dtype)


def presented(lowerer, node, layout: Layout) -> Declared:
    """`node` in a layout fixed before it was lowered (a contiguous one): in place when its
    view walks the same elements, else copied."""
    found = operand(lowerer, node, layout.dims)
    return found if found.layout == layout else Declared(found.key, found.view, layout, copy=True)


def result_layout(dims, dtype: str, strides=None) -> Layout:
    """A result's layout: contiguous, unless `strides`."""
    dims = tuple(int(size) for size in dims)
    return Layout(dims, _canonical(strides if strides is not None else contiguous_strides(dims), dims), dtype)


def target(key: str, dims, dtype: str, offset: int = 0, strides=None) -> Declared:
    """A result written into buffer `key` (contiguous unless `strides`), from `offset`."""
    layout = result_layout(dims, dtype, strides)
    return Declared(key, View(layout.dims, layout.strides, offset), layout)


def _emit_launch(lowerer, match, plan, engine: str, sources: list, targets: list) -> None:
    writes = tuple(dict.fromkeys(result.key for result in targets))
    workspace = lowerer.new_buffer("f32", (-(-plan.workspace_bytes // 4),)) if plan.workspace_bytes else None

    def run(env):
        plan.execute([declared.tensor(env) for declared in sources + targets], env[workspace] if workspace else None)

    reads = tuple(dict.fromkeys(source.key for source in sources))
    lowerer.launches.append(TorchLaunch(run, reads, writes + ((workspace,) if workspace else ()), "pattern",
                                   engine=engine, pattern=match.key.key()))


def _device_index() -> int:
    return cudnn_engines.current_device()


# --- attention --------------------------------------------------------------------------------

def _attention_forward(lowerer, match):
    node, key = match.nodes[0], match.key
    sources = [operand(lowerer, source, dims) for source, dims in zip(node.inputs, (key.q_dims, key.k_dims, key.v_dims))]
    results = [result_layout(key.o_dims, key.dtype)] + ([result_layout(key.stats_dims, "f32")] if key.stats else [])
    plan, engine = first_plan(PatternGraph("attention", key, tuple(s.layout for s in sources) + tuple(results)),
                              _device_index())
    if plan is None:
        return None, engine

    def emit():
        out = lowerer.result_buffer(node)
        targets = [target(out, results[0].dims, key.dtype)]
        if key.stats:
            lowerer.shared[(STATS, node)] = lowerer.new_buffer("f32", node.shape[:-1])
            targets.append(target(lowerer.shared[(STATS, node)], results[1].dims, "f32"))
        _emit_launch(lowerer, match, plan, engine, sources, targets)
        lowerer.values[node] = lowerer.loaded(node, out)

    return emit, engine


def _statistics(lowerer, match, sources: list):
    """(emit() -> the statistics' Declared, or None; why not): the forward's buffer when `o`
    is a taken forward of the same operands, else a forward graph computing them into
    scratch first."""
    o = match.operands[3]
    found = lowerer.shared.get((STATS, o))
    if found is not None and o.inputs == match.operands[:3] and o.attrs == match.nodes[0].attrs:
        return (lambda: target(found, match.key.stats_dims, "f32")), ""
    key = replace(match.key, role="Forward", stats=True)
    layouts = (*(s.layout for s in sources[:3]), result_layout(key.o_dims, key.dtype),
               result_layout(key.stats_dims, "f32"))
    plan, engine = first_plan(PatternGraph("attention", key, layouts), _device_index())
    if plan is None:
        return None, f"its forward, for the statistics: {engine}"

    def emit():
        scratch = [target(lowerer.new_buffer(layout.dtype, layout.dims), layout.dims, layout.dtype)
                   for layout in layouts[3:]]
        _emit_launch(lowerer, replace(match, key=key), plan, engine, sources[:3], scratch)
        return scratch[1]

    return emit, engine


def _gradients(match) -> list:
    """(the cotangent op writing it or None: scratch, dims, strides, offset) of dQ, dK, dV:
    dK then dV along the last axis of attention_grad_kv's buffer."""
    key = match.key
    by_op = {node.op: node for node in match.nodes}
    dq, dk, dv = key.q_dims, key.k_dims, key.v_dims
    both = by_op.get("attention_grad_kv")
    if both is None:
        return [(by_op.get("attention_grad_q"), dq, None, 0), (None, dk, None, 0), (None, dv, None, 0)]
    row = key.width + key.value_width
    strides = (key.heads * key.keys * row, key.keys * row, row, 1)
    return [(by_op.get("attention_grad_q"), dq, None, 0), (both, dk, strides, 0), (both, dv, strides, key.width)]


def _attention_backward(lowerer, match):
    key = match.key
    dims = (key.q_dims, key.k_dims, key.v_dims, key.o_dims, key.o_dims)  # q, k, v, o and its cotangent
    sources = [operand(lowerer, source, shape) for source, shape in zip(match.operands, dims)]
    gradients = _gradients(match)
    results = [result_layout(shape, key.dtype, strides) for _, shape, strides, _ in gradients]
    layouts = (*(s.layout for s in sources), result_layout(key.stats_dims, "f32"), *results)
    plan, engine = first_plan(PatternGraph("attention", key, layouts), _device_index())
    if plan is None:
        return None, engine
    statistics, why = _statistics(lowerer, match, sources)
    if statistics is None:
        return None, why

    def emit():
        stats = statistics()
        buffers = {node: lowerer.result_buffer(node) for node in match.nodes}
        targets = [target(buffers[node] if node is not None else lowerer.new_buffer(key.dtype, shape), shape, key.dtype,
                          offset, strides) for node, shape, strides, offset in gradients]
        _emit_launch(lowerer, match, plan, engine, sources + [stats], targets)
        for node, key_ in buffers.items():
            lowerer.values[node] = lowerer.loaded(node, key_)

    return emit, engine


# --- products and convolutions with their epilogues --------------------------------------------

def _epilogue_dims(match) -> tuple:
    """(a, b, bias, result) dims as the graph declares them: (1, rows, inner), (1, inner,
    columns), (1, 1, columns), (1, rows, columns) for a product; NCHW for a convolution."""
    product = match.key.product
    if match.pattern == "products":
        rows, inner, columns = product.rows, product.inner, product.columns
        return (1, rows, inner), (1, inner, columns), (1, 1, columns), (1, rows, columns)
    return product.image, product.weight, (1, product.out, 1, 1), product.result


def _epilogue(lowerer, match):
    key = match.key
    first_dims, second_dims, bias_dims, result_dims = _epilogue_dims(match)
    first, second = (operand(lowerer, node, shape) for node, shape in zip(match.operands[:2], (first_dims, second_dims)))
    bias = result_layout(bias_dims, "f32")
    results = [result_layout(result_dims, "f32") for _ in match.results]
    plan, engine = first_plan(PatternGraph(match.pattern, key, (first.layout, second.layout, bias, *results)),
                              _device_index())
    if plan is None:
        return None, engine

    def emit():  # at the group's last node: its bias is lowered by now
        sources = [first, second, presented(lowerer, match.operands[2], bias)]
        buffers = [lowerer.result_buffer(node) for node in match.results]
        _emit_launch(lowerer, match, plan, engine, sources, [target(key_, result_dims, "f32") for key_ in buffers])
        for node, key_ in zip(match.results, buffers):
            lowerer.values[node] = lowerer.loaded(node, key_)

    return emit, engine


def _attention(lowerer, match):
    return {"Forward": _attention_forward, "Backward": _attention_backward}[match.key.role](lowerer, match)


# pattern -> prepare(lowerer, match) -> (emit() or None, the engine text or why cuDNN declines)
STEPS = {"attention": _attention, "products": _epilogue, "convolutions": _epilogue}


class Patterns:
    """The matches of the patterns on in one graph, and what the lowering did with them."""

    def __init__(self, graph, names):
        self.matches = match_patterns(graph, names)
        self.covered: set = set()  # the nodes of taken matches
        self.deferred: dict = {}  # a taken match's emit node -> emit()
        self.uses: list = []  # PatternUse, in the order the matches were met

    def skip(self, lowerer, node) -> bool:
        emit = self.deferred.pop(node, None)
        if emit is not None:
            emit()
        return node in self.covered

    def take(self, lowerer, node) -> bool:
        match = self.matches.get(node)
        if match is None:
            return False
        emit, said = STEPS[match.pattern](lowerer, match)
        self.uses.append(PatternUse(match.pattern, match.key.key(), emit is not None, "" if emit else said))
        if emit is None:
            return False
        self.covered.update(match.nodes)
        if match.emit is node:
            emit()
        else:
            self.deferred[match.emit] = emit
        return True
