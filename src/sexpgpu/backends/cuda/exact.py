"""The CUDA backend's lowering of exact graphs: the interpreter's exact rules, on the device.

An exact graph (graph/passes/exact_region.py) marks what is exact: a node of dtype acc takes
its rule in ACC, one marked exact its rule in EXACT (RuleTables, graph/core/rules.py). The
lowerer reaches them through one hook (lowering.py): `ExactLowering.of(graph)`, then
`lowering(node)` before each node's float lowering and `finish` before the outputs.

Every op that sums is a launch calling the exact sums the interpreter calls (exact_ops.py) on
the device's tensors, by their fast paths where there are any: each sum exact and rounded
once, so its bits are the interpreter's. Between the sums, elementwise arithmetic lowers as
in every graph (fused portable float32 math, each node rounded where the interpreter rounds
it). Where an op is more than one sum, the launches are those of backends/cpu/exact_kernels.py,
each intermediate written out in float32 where the interpreter holds a float32 array:

- softmax: M = max, E = exp(x - M), S = round(exact sum of E), then E / S; log_softmax:
  (x - M) - log(S); cross_entropy: -((x[label] - M) - log(S)), the label's logit copied out,
  and the loss's gradient, the softmax of the same logits, reads the same E and S;
- layernorm: c = x - round(exact sum of x) / D, q = c * c, y = c * rsqrt(round(exact sum of q) / D + eps);
- avg_pool2d: round(exact window sum) / (KH * KW); avg_pool2d_grad: the share g / (KH * KW),
  then each element's exact sum over the windows reaching it;
- max, max_pool2d and the window's first maximum: exact in any order, with the interpreter's
  rule for signed zeros and NaN (exact_ops.maxima; over trailing axes in one pass, exact_maxima.py).

Acc values live in the environment beside the arena (buffers of kind "accumulator"):
a sum over the batch is a `PendingSum` of its operands (backends/exact_sums.py), reshaped and
transposed as such, its digits formed only where something adds to it (an `add` of the
region, or the step's `accumulate` graph); the backend forms the rest before the graph runs
again (backend.py). A step of one call so rounds each gradient straight from its operands.
Ids (an embedding's, a cross-entropy's labels) are checked as the interpreter checks them
(E-INDEX-001), on the host, by a launch that reads them back as the call runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sexpgpu.backends import exact_ops as ops
from sexpgpu.backends.exact_sums import PendingSum, accumulated
from sexpgpu.backends.cpu.op_kernels import check_ids
from sexpgpu.backends.cuda.codegen.expr import Expr, load, scalar, unary
from sexpgpu.backends.cuda.codegen.space import View, broadcast_view, contiguous
from sexpgpu.backends.cuda.elementwise import constant
from sexpgpu.backends.cuda.reductions import integer_reduction, softmax_beside
from sexpgpu.backends.cuda.gathers import gather
from sexpgpu.backends.cuda.launches import DEVICE, Operand, TorchLaunch, reads_of, same_memory, strided
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.core.rules import RuleTable
from sexpgpu.graph.core.ops import OPS
from sexpgpu.graph.passes.exact_region import EXACT_FORMS, ROLES, is_exact, on_acc


class ExactLowering:
    """Which lowering a node of an exact graph takes instead of the float one: its acc rule
    when it makes or reads acc values, its exact rule when it is marked exact."""

    def __init__(self):
        self.held: list = []  # buffers a PendingSum reads after its launch: kept to the run's end

    @classmethod
    def of(cls, graph):
        """The exact lowering of a graph with exact nodes, None for a float graph."""
        return cls() if any(is_exact(node) for node in graph.nodes) else None

    def lowering(self, node):
        if on_acc(node):
            return ACC[node.op]
        return EXACT[node.op] if node.attrs.get("exact", False) else None

    def finish(self, lowerer) -> None:
        """A last launch that reads the buffers pending sums hold, so that the memory plan keeps
        them to the end of the run; the backend forms the sums before the next run."""
        if self.held:
            held = tuple(dict.fromkeys(self.held))
            lowerer.launches.append(TorchLaunch(lambda env: None, held, (), "hold"))


# --- reading and writing buffers --------------------------------------------------------------


def as_interpreted(operand, env) -> torch.Tensor:
    """The operand as the interpreter holds it: floats (bf16 ones too) as float32, integers as they are."""
    value = operand.strided(env)
    return value.float() if value.is_floating_point() else value


def _write(lowerer, key: str, sources, compute, kind: str = "exact", into: bool = False) -> None:
    """A launch writing compute(*the sources' tensors) into buffer `key`; the result already has
    the buffer's dtype (rounded once), so the copy rounds nothing. into: compute also takes
    out=, the buffer, and may write the result there itself, which then needs no copy."""
    def run(env):
        target = env[key]
        tensors = [as_interpreted(source, env) for source in sources]
        result = (compute(*tensors, out=target) if into else compute(*tensors)).reshape(target.shape)
        if not same_memory(result, target):
            target.copy_(result)

    lowerer.launches.append(TorchLaunch(run, reads_of(sources), (key,), kind))


def _node_launch(lowerer, node, compute, kind: str = "exact", into: bool = False, sources=None) -> None:
    """The node's value is compute(*its inputs' tensors, or the `sources`' given), written into its own buffer."""
    sources = lowerer.operands(node.inputs) if sources is None else sources
    key = lowerer.result_buffer(node)
    _write(lowerer, key, sources, compute, kind, into)
    lowerer.values[node] = lowerer.loaded(node, key)


def _rounded(node, accumulate):
    """compute(*tensors) for a node: the exact sums `accumulate` forms, rounded once into its dtype."""
    return lambda *tensors: ops.rounded(accumulate(*tensors), node.shape, node.dtype)


def _float_buffer(lowerer, shape, sources, compute, kind: str) -> str:
    """A float32 buffer of `shape` holding compute(*the sources' tensors)."""
    key = lowerer.new_buffer("f32", shape)
    _write(lowerer, key, sources, compute, kind)
    return key


def _written(lowerer, value: Expr, shape) -> Operand:
    """A float32 expression written out by a fused elementwise kernel, for a launch to read."""
    key = lowerer.new_buffer("f32", shape)
    lowerer.emit_elementwise(tuple(shape), key, "f32", value)
    return Operand(key, contiguous(shape))


def _over(key: str, shape, space) -> Expr:
    """A contiguous float32 buffer of `shape` read broadcast over `space`."""
    return load(key, broadcast_view(shape, space), "f32")


def _per_row(key: str, lead) -> Expr:
    """A (*lead, 1) float32 buffer read over `lead`."""
    return load(key, contiguous(lead), "f32") if lead else scalar(key, "f32")


def _check_launch(lowerer, node, ids, bound: int, what: str) -> None:
    """A launch raising the interpreter's E-INDEX-001 for an id outside 0..bound-1, read back and
    checked on the host, as the call runs."""
    def check(env) -> None:
        check_ids(ids.strided(env).cpu().numpy(), bound, what, node)

    lowerer.launches.append(TorchLaunch(check, (ids.key,), (), "check"))


# --- sums and maxima ------------------------------------------------------------------------------


def _matmul(lowerer, node) -> None:
    # written straight into the node's buffer where the queued path takes it: a logits'
    # product is 1.6 GB of float32 in gpt-50m, whose copy took 0.76 ms on an H200
    _node_launch(lowerer, node, lambda a, b, out: ops.rounded_product(a, b, node.shape, node.dtype, out=out),
               "exact-matmul", into=True)


def _reduction(exact):
    """A sum or max: exact(node, x) for float inputs; integers, exact in any order, reduce as
    in any graph."""
    def lower(lowerer, node) -> None:
        if node.inputs[0].dtype in ("i32", "bool"):
            integer_reduction(lowerer, node)
        else:
            _node_launch(lowerer, node, lambda x: exact(node, x), f"exact-{node.op}")

    return lower


def _maxima(x, axes, keep: bool):
    """exact_ops.maxima's value in one pass where it can (exact_maxima.py)."""
    from sexpgpu.backends.cuda.exact_maxima import maxima  # its kernel is decorated where it runs (Triton's interpreter on CPU tensors)

    return maxima(x, axes, keep)


def _scatter_add(lowerer, node) -> None:
    rows = node.attrs["rows"]
    _check_launch(lowerer, node, lowerer.operands(node.inputs[:1])[0], rows, "embedding id")

    def compute(ids, values):
        return ops.rounded_scatter(ids, values, rows, node.shape, node.dtype)

    _node_launch(lowerer, node, compute, "exact-scatter")


def _checked_gather(lowerer, node) -> None:
    """An embedding lookup copies rows (exact); its ids are checked first."""
    (ids,) = lowerer.operands(node.inputs[1:])
    _check_launch(lowerer, node, ids, node.inputs[0].shape[0], "embedding id")
    gather(lowerer, node)


# --- the rows of softmax, log_softmax and cross_entropy -----------------------------------------


@dataclass(frozen=True)
class RowParts:
    """What a normalisation along `axis` of x computes, over x's axes: shifted = x - M (an
    expression), exps = exp(shifted) and total = S broadcast (loads), and the buffers of the
    row maxima M and the rounded exact sums S, each (*x's shape with axis 1)."""

    shifted: Expr
    exps: Expr
    total: Expr
    top: str
    sums: str


def _row_parts(lowerer, x, axis: int) -> RowParts:
    kept = tuple(1 if index == axis else size for index, size in enumerate(x.shape))
    source = lowerer.operands([x])
    top = _float_buffer(lowerer, kept, source, lambda t: _maxima(t, (axis,), True), "exact-max")
    shifted = lowerer.value_in(x, x.shape) - _over(top, kept, x.shape)
    exps = _written(lowerer, unary("exp", shifted), x.shape)
    sums = _float_buffer(lowerer, kept, [exps], lambda e: ops.rounded_sum(e, (axis,), kept, "f32"), "exact-sum")
    return RowParts(shifted, load(exps.key, contiguous(x.shape), "f32"), _over(sums, kept, x.shape), top, sums)


def _softmax(lowerer, node) -> None:
    (x,) = node.inputs
    parts = _row_parts(lowerer, x, node.attrs["axis"])
    lowerer.take_value(node, parts.exps / parts.total)


def _log_softmax(lowerer, node) -> None:
    (x,) = node.inputs
    parts = _row_parts(lowerer, x, node.attrs["axis"])
    lowerer.take_value(node, parts.shifted - unary("log", parts.total))


def _cross_entropy(lowerer, node) -> None:
    logits, labels = node.inputs
    classes, lead = logits.shape[-1], tuple(labels.shape)
    parts = _row_parts(lowerer, logits, logits.rank - 1)
    softmax = softmax_beside(lowerer, logits)
    if softmax is not None:  # the interpreter's softmax of these logits is E / S to the bit
        lowerer.take_value(softmax, parts.exps / parts.total)
    _check_launch(lowerer, node, lowerer.operands([labels])[0], classes, "cross-entropy label")

    def pick(x, ids):
        return torch.gather(x, -1, ids.to(torch.int64)[..., None])

    picked = _float_buffer(lowerer, lead + (1,), lowerer.operands([logits, labels]), pick, "exact-pick")
    log_softmax = (_per_row(picked, lead) - _per_row(parts.top, lead)) - unary("log", _per_row(parts.sums, lead))
    lowerer.take_value(node, -log_softmax)


def _layernorm(lowerer, node) -> None:
    (x,) = node.inputs
    last, kept = x.rank - 1, tuple(x.shape[:-1]) + (1,)
    count = constant(x.shape[-1], "f32")

    def row_sums(t):
        return ops.rounded_sum(t, (last,), kept, "f32")

    mean = _over(_float_buffer(lowerer, kept, lowerer.operands([x]), row_sums, "exact-sum"), kept, x.shape) / count
    centered = lowerer.value_in(x, x.shape) - mean
    squares = _written(lowerer, centered * centered, x.shape)
    var = _over(_float_buffer(lowerer, kept, [squares], row_sums, "exact-sum"), kept, x.shape) / count
    lowerer.take_value(node, centered * unary("rsqrt", var + constant(node.attrs["eps"], "f32")))


# --- windows ------------------------------------------------------------------------------------------


def _geometry(node) -> tuple:
    return node.attrs["stride"], node.attrs["padding"]


def _window(node) -> tuple:
    return node.attrs["kernel"], node.attrs["stride"]


def _window_size(node) -> Expr:
    kernel = node.attrs["kernel"]
    return constant(kernel[0] * kernel[1], "f32")


def _convolution(accumulate):
    """A convolution or its cotangent: accumulate(*its two inputs, stride, padding, shape), rounded once."""
    def lower(lowerer, node) -> None:
        compute = _rounded(node, lambda a, b: accumulate(a, b, *_geometry(node), node.shape))
        _node_launch(lowerer, node, compute, "exact-convolution")

    return lower


def _avg_pool2d(lowerer, node) -> None:
    kernel, stride = _window(node)

    def window_sums(x):
        return ops.rounded(ops.window_sums(x, kernel, stride, node.shape[2:]), node.shape, "f32")

    total = _float_buffer(lowerer, node.shape, lowerer.operands(node.inputs), window_sums, "exact-pooling")
    lowerer.take_value(node, load(total, contiguous(node.shape), "f32") / _window_size(node))


def _avg_pool2d_grad(lowerer, node) -> None:
    (g,) = node.inputs
    kernel, stride = _window(node)
    share = _written(lowerer, lowerer.value_in(g, g.shape) / _window_size(node), g.shape)

    def spread(values):
        return ops.spread_values(lambda index: values, node.shape, kernel, stride, g.shape[2:])

    _node_launch(lowerer, node, _rounded(node, spread), "exact-pooling", sources=[share])


def _max_pool2d(lowerer, node) -> None:
    kernel, stride = _window(node)
    _node_launch(lowerer, node, lambda x: ops.window_maxima(x, kernel, stride, node.shape[2:]), "exact-pooling")


def _max_pool2d_grad(lowerer, node) -> None:
    compute = _rounded(node, lambda x, g: ops.max_pool2d_grad(x, g, *_window(node), node.shape))
    _node_launch(lowerer, node, compute, "exact-pooling")


def _max_pool2d_pick(lowerer, node) -> None:
    kernel, stride = _window(node)
    _node_launch(lowerer, node, lambda x, h: ops.max_pool2d_pick(x, h, kernel, stride, node.shape[2:]), "exact-pooling")


def _refused(lowerer, node) -> None:
    raise SexpgpuError("E-EXACT-003", f"the CUDA backend has no exact kernel for the bf16 op '{node.op}': "
                       ":arithmetic exact computes attention in float32.", node.loc)


EXACT = RuleTable("cuda exact lowering", needs=lambda op: op.name in EXACT_FORMS)
for _op, _rule in {
    "matmul": _matmul,
    "sum": _reduction(lambda node, x: ops.rounded_sum(x, node.attrs["axes"], node.shape, node.dtype)),
    "max": _reduction(lambda node, x: _maxima(x, node.attrs["axes"], node.attrs["keep"])),
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "cross_entropy": _cross_entropy,
    "layernorm": _layernorm,
    "scatter_add": _scatter_add,
    "gather": _checked_gather,
    "conv2d": _convolution(ops.conv2d),
    "conv2d_input_grad": _convolution(ops.conv2d_input_grad),
    "conv2d_weight_grad": _convolution(ops.conv2d_weight_grad),
    "avg_pool2d": _avg_pool2d,
    "avg_pool2d_grad": _avg_pool2d_grad,
    "max_pool2d": _max_pool2d,
    "max_pool2d_grad": _max_pool2d_grad,
    "max_pool2d_pick": _max_pool2d_pick,
    # a float32 attention op is written out as its composition (graph/passes/decomposed.py); a bf16 one keeps its op
    **{name: _refused for name, op in OPS.items() if op.kind == "attention"},
}.items():
    EXACT.add(_op, _rule)


# --- the gradient region: sums in the environment -----------------------------------------------


def _region_launch(lowerer, node, reads: tuple, compute) -> None:
    """A launch putting compute(env) (an Accumulator or a PendingSum) at the node's accumulator key."""
    key = lowerer.accumulator_buffer(node)

    def run(env):
        env[key] = compute(env)

    lowerer.launches.append(TorchLaunch(run, reads, (key,), "exact-region"))


def _reducing(digits, rounded):
    """A region node that sums rounded values, as a PendingSum of its inputs' tensors:
    digits(node, *tensors) forms it, rounded(node, *tensors) rounds it once by a fast path."""
    def lower(lowerer, node) -> None:
        sources = lowerer.operands(node.inputs)
        lowerer.exact.held.extend(source.key for source in sources)

        def pending(env):
            tensors = [as_interpreted(source, env) for source in sources]
            as_they_lie = all(tensor.data_ptr() == source.strided(env).data_ptr()
                              for tensor, source in zip(tensors, sources))  # no float32 copy made
            return PendingSum(lambda: digits(node, *tensors), lambda: rounded(node, *tensors), as_they_lie)

        _region_launch(lowerer, node, reads_of(sources), pending)

    return lower


def _carrying(move):
    """A region node over sums: move(node, *its inputs' sums), exact."""
    def lower(lowerer, node) -> None:
        keys = tuple(lowerer.accumulators[source] for source in node.inputs)
        _region_launch(lowerer, node, keys, lambda env: move(node, *[env[key] for key in keys]))

    return lower


def _moving(move_digits, move_values):
    """A reshape or transpose: of a PendingSum, a PendingSum still; of digits, digits."""
    def move(node, value):
        if isinstance(value, PendingSum):
            return value.moved(lambda acc: move_digits(node, acc), lambda tensor: move_values(node, tensor))
        return move_digits(node, value)

    return _carrying(move)


def _checked_region_scatter(lowerer, node) -> None:
    """An embedding's gradient: its ids checked as the call runs, its sums pending."""
    rows = node.attrs["rows"]
    _check_launch(lowerer, node, lowerer.operands(node.inputs[:1])[0], rows, "embedding id")
    _reducing(lambda node, ids, values: ops.scattered(ids, values, rows, node.shape),
              lambda node, ids, values: ops.rounded_scatter(ids, values, rows, node.shape, "f32"))(lowerer, node)


def _region_const(lowerer, node) -> None:
    _region_launch(lowerer, node, (), lambda env: ops.constant(node.attrs["value"], node.shape, env[DEVICE]))


ACC = RuleTable("cuda acc lowering", needs=lambda op: op.name in ROLES)
for _op, _rule in {
    "matmul": _reducing(lambda node, a, b: ops.product(a, b, node.shape),
                        lambda node, a, b: ops.rounded_product(a, b, node.shape, "f32")),
    "sum": _reducing(lambda node, x: ops.shaped(ops.summed(x, node.attrs["axes"]), node.shape),
                     lambda node, x: ops.rounded_sum(x, node.attrs["axes"], node.shape, "f32")),
    "scatter_add": _checked_region_scatter,
    "conv2d_weight_grad": _reducing(lambda node, x, g: ops.conv2d_weight_grad(x, g, *_geometry(node), node.shape),
                                    lambda node, x, g: ops.rounded_conv2d_weight_grad(x, g, *_geometry(node), node.shape)),
    "add": _carrying(lambda node, *sums: ops.added([accumulated(value) for value in sums], node.shape)),
    "reshape": _moving(lambda node, acc: ops.shaped(acc, node.shape), lambda node, tensor: tensor.reshape(node.shape)),
    "transpose": _moving(lambda node, acc: ops.transposed(acc, node.attrs["perm"]),
                         lambda node, tensor: tensor.permute(*node.attrs["perm"]).contiguous()),
    "const": _region_const,
}.items():
    ACC.add(_op, _rule)
