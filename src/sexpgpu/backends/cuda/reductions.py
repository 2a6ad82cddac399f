"""Reductions, normalisations and the loss as row or column kernels.

The kernel's space is the input's axes reordered: for a row kernel the kept axes then the
reduced axes (softmax's axis last), for a column kernel the reduced axes then the kept
ones. The choice depends only on whether the input's last axis is reduced: then the reduced
elements of a row are close in memory. The input's expression is inlined into the kernel,
so the elementwise chain that made it is fused with the reduction.
"""

from __future__ import annotations

from sexpgpu.backends.cuda import views
from sexpgpu.backends.cuda.codegen import recipes
from sexpgpu.backends.cuda.codegen.columns import ColumnSpec
from sexpgpu.backends.cuda.codegen.expr import Expr, iota, load, row
from sexpgpu.backends.cuda.codegen.rows import Phase, Reduction
from sexpgpu.backends.cuda.rowmerge import RowLaunch
from sexpgpu.backends.cuda.codegen.space import View, contiguous, contiguous_strides, unit_view
from sexpgpu.backends.cuda.launches import ColumnLaunch, torch_dtype
from sexpgpu.graph.core.rules import RuleTable

REDUCTIONS = RuleTable("cuda row and column kernels", needs=lambda op: op.kind in ("reduce", "normalize", "loss"))


def in_space(lowerer, node, perm) -> Expr:
    """`node`'s value with its axes in the order `perm`."""
    perm = tuple(perm)
    if perm == tuple(range(node.rank)):
        return lowerer.values[node]
    return lowerer.value_through(node, lambda view: views.transpose(view, node.shape, perm))


def _rows(lowerer, node, space, reduced_rank, phases, outputs, row_stores=(), kind="rows") -> None:
    """Emit a row kernel writing `outputs` [(key, view over space, dtype)], the first the node's result."""
    lowerer.emit_result(node, RowLaunch(tuple(space), reduced_rank, list(outputs), list(phases), list(row_stores), kind))


def _columns(lowerer, node, reduced, kept, reduction: Reduction, key: str) -> None:
    spec = ColumnSpec(tuple(reduced), tuple(kept), (), (reduction,), ((contiguous(kept), node.dtype),), ((0, row(0)),))
    lowerer.emit_result(node, ColumnLaunch(spec, (key,)))


def per_row_view(space, lead_rank: int) -> View:
    """A contiguous output of the lead axes, seen over the whole space."""
    lead = tuple(space[:lead_rank])
    return View(tuple(space), contiguous_strides(lead) + (0,) * (len(space) - lead_rank))


@REDUCTIONS.rule("sum", "max")
def reduce(lowerer, node) -> None:
    (x,) = node.inputs
    axes = tuple(node.attrs["axes"])
    if not axes:
        lowerer.values[node] = lowerer.values[x]
        return
    if x.dtype in ("i32", "bool"):
        integer_reduction(lowerer, node)
        return
    kept = tuple(axis for axis in range(x.rank) if axis not in axes)
    kept_shape = tuple(x.shape[axis] for axis in kept)
    reduced_shape = tuple(x.shape[axis] for axis in axes)
    key = lowerer.result_buffer(node)
    if x.rank - 1 in axes:
        space = kept_shape + reduced_shape
        value = in_space(lowerer, x, kept + axes)
        outputs = [(key, per_row_view(space, len(kept)), node.dtype)]
        _rows(lowerer, node, space, len(axes), [Phase((Reduction(node.op, value),))], outputs, [(0, row(0))])
    else:
        value = in_space(lowerer, x, axes + kept)
        _columns(lowerer, node, reduced_shape, kept_shape, Reduction(node.op, value), key)


def integer_reduction(lowerer, node) -> None:
    """Sums and maxima of integers are exact in any order: PyTorch's own, in int64 and
    wrapped to int32 as the interpreter's int32 fold wraps."""
    import torch

    axes, keep, op = tuple(node.attrs["axes"]), node.attrs["keep"], node.op

    def write(out, data):
        if op == "sum":
            total = torch.sum(data.to(torch.int64), dim=axes, keepdim=keep)
        else:
            total = torch.amax(data, dim=axes, keepdim=keep)
        out.copy_(total.to(torch_dtype(node.dtype)).reshape(node.shape))

    lowerer.emit_torch(node, "integer-reduction", write)


def _over_axis(node, axis: int):
    """(perm putting `axis` of the node's input last, the space). The input's rank, not the
    node's: argmax drops the axis."""
    source = node.inputs[0]
    perm = tuple(other for other in range(source.rank) if other != axis) + (axis,)
    return perm, tuple(source.shape[other] for other in perm)


# each normalisation's phases over the row of its axis, from the node and its input's value
NORMALIZATIONS = {
    "softmax": lambda node, value: recipes.softmax(value, 0),
    "log_softmax": lambda node, value: recipes.log_softmax(value, 0),
    "layernorm": lambda node, value: recipes.layernorm(value, node.inputs[0].shape[-1], node.attrs["eps"], 0),
}


@REDUCTIONS.rule(*NORMALIZATIONS)
def normalize(lowerer, node) -> None:
    (x,) = node.inputs
    axis = node.attrs.get("axis", x.rank - 1)
    perm, space = _over_axis(node, axis)
    value = in_space(lowerer, x, perm)
    key = lowerer.result_buffer(node)
    own = contiguous_strides(node.shape)
    out_view = View(space, tuple(own[other] for other in perm))
    _rows(lowerer, node, space, 1, NORMALIZATIONS[node.op](node, value), [(key, out_view, node.dtype)])


@REDUCTIONS.rule("argmax")
def argmax(lowerer, node) -> None:
    (x,) = node.inputs
    perm, space = _over_axis(node, node.attrs["axis"])
    value = in_space(lowerer, x, perm)
    key = lowerer.result_buffer(node)
    phases, result = recipes.argmax(value, iota(unit_view(space, len(space) - 1)), space[-1])
    _rows(lowerer, node, space, 1, phases, [(key, per_row_view(space, len(space) - 1), "i32")], [(0, result)])


@REDUCTIONS.rule("cross_entropy")
def cross_entropy(lowerer, node) -> None:
    logits, labels = node.inputs
    space = tuple(logits.shape)
    lead = tuple(labels.shape)
    unit = lead + (1,)

    def label_view(view):
        widened = views.reshape(view, lead, unit)
        return views.broadcast(widened, unit, space)

    label = lowerer.value_through(labels, label_view)
    key = lowerer.result_buffer(node)
    column = iota(unit_view(space, len(space) - 1))
    outputs = [(key, per_row_view(space, len(lead)), node.dtype)]
    softmax = softmax_beside(lowerer, logits)
    exps = 1 if softmax is not None else None
    phases, loss = recipes.cross_entropy(lowerer.values[logits], label, column, exps_output=exps)
    row_stores = [(0, loss)]
    if softmax is not None:
        lowerer.decide(softmax, "the loss kernel gives it beside the loss")
        exps_key, total_key = lowerer.new_buffer("f32", space), lowerer.new_buffer("f32", unit)
        outputs += [(exps_key, contiguous(space), "f32"), (total_key, per_row_view(space, len(lead)), "f32")]
        row_stores.append((2, row(1)))
    _rows(lowerer, node, space, 1, phases, outputs, row_stores, "cross-entropy")
    if softmax is not None:
        total = load(total_key, View(space, contiguous_strides(unit)[:-1] + (0,)))
        lowerer.values[softmax] = load(exps_key, contiguous(space)) / total


def softmax_beside(lowerer, logits):
    """The float32 softmax over the last axis of the same logits (the cross-entropy's
    gradient), which the loss kernel can give as exps and their per-row sum; else None."""
    for reader in lowerer.graph.consumers()[logits]:
        last = reader.op == "softmax" and reader.attrs.get("axis", logits.rank - 1) == logits.rank - 1
        if last and reader.dtype == "f32" and logits.dtype == "f32" and reader not in lowerer.values \
                and lowerer.policy.fuses:
            return reader
    return None
