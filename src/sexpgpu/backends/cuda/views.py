"""The IR's movement ops as changes of view: a reshape, transpose, slice or broadcast of a
value never copies it; every reader's loads go through the changed view instead.

Each function maps a `View` over the value's shape to a view over the new shape, or returns
None when no strided view can express the result; then the lowering writes the value out
contiguously first (a copy), which every movement can view.
"""

from __future__ import annotations

from sexpgpu.backends.cuda.codegen.expr import Expr, map_leaves
from sexpgpu.backends.cuda.codegen.space import View, contiguous_strides, numel
from sexpgpu.graph.core.rules import RuleTable


def broadcast(view: View, source_shape, target_shape) -> View | None:
    """numpy broadcasting of `source_shape` to `target_shape`."""
    source_shape, target_shape = tuple(source_shape), tuple(target_shape)
    if source_shape == target_shape:
        return view
    if not view.over(source_shape):
        return None
    missing = len(target_shape) - len(source_shape)
    strides = [0] * missing
    for size, stride, target in zip(source_shape, view.strides, target_shape[missing:]):
        strides.append(0 if size == 1 and target != 1 else stride)
    return View(target_shape, tuple(strides), view.offset)


def transpose(view: View, source_shape, perm) -> View | None:
    if not view.over(source_shape):
        return None
    return View(tuple(view.dims[axis] for axis in perm), tuple(view.strides[axis] for axis in perm), view.offset)


def slice_axis(view: View, source_shape, axis: int, start: int, stop: int) -> View | None:
    if not view.over(source_shape):
        return None
    dims = list(view.dims)
    dims[axis] = stop - start
    return View(tuple(dims), view.strides, view.offset + start * view.strides[axis])


def reshape(view: View, source_shape, target_shape) -> View:
    """A strided view of the new shape when the old strides allow one (PyTorch's `view`
    rule); otherwise the view keeps its own axes and is read by flat position."""
    source_shape, target_shape = tuple(source_shape), tuple(target_shape)
    if not view.over(source_shape):
        return view
    strides = reshape_strides(source_shape, view.strides, target_shape)
    if strides is None:
        return view
    return View(target_shape, strides, view.offset)


def reshape_strides(old_shape, old_strides, new_shape):
    """Strides that walk `new_shape` over the same elements, or None. Groups of old axes
    that are contiguous with each other may be split or merged freely."""
    if numel(old_shape) == 0 or not old_shape:
        return contiguous_strides(new_shape) if not old_shape else None
    new_strides = [0] * len(new_shape)
    view_axis = len(new_shape) - 1
    chunk_stride = old_strides[-1]
    tensor_count, view_count = 1, 1
    for axis in range(len(old_shape) - 1, -1, -1):
        tensor_count *= old_shape[axis]
        boundary = axis == 0 or (old_shape[axis - 1] != 1 and old_strides[axis - 1] != tensor_count * chunk_stride)
        if not boundary:
            continue
        while view_axis >= 0 and (view_count < tensor_count or new_shape[view_axis] == 1):
            new_strides[view_axis] = view_count * chunk_stride
            view_count *= new_shape[view_axis]
            view_axis -= 1
        if view_count != tensor_count:
            return None
        if axis > 0:
            chunk_stride = old_strides[axis - 1]
            tensor_count, view_count = 1, 1
    if view_axis != -1:
        return None
    return tuple(new_strides)


def through(value: Expr, change) -> Expr | None:
    """`value` with `change(view)` applied to every view its leaves read through, or None
    when some view cannot be changed so."""
    failed = []

    def leaf(node: Expr) -> Expr:
        if node.op == "load":
            key, view = node.attr
            changed = change(view)
            if changed is None:
                failed.append(node)
                return node
            return Expr("load", (), (key, changed), node.dtype)
        if node.op == "iota":
            changed = change(node.attr)
            if changed is None:
                failed.append(node)
                return node
            return Expr("iota", (), changed, node.dtype)
        return node

    result = map_leaves(value, leaf)
    return None if failed else result


# The movement ops as view changes: `VIEWS[op](node, source)` maps a view of the source's
# buffer to the node's, or to None when no strided view can express it.
VIEW_OPS = ("reshape", "transpose", "slice", "broadcast")
VIEWS = RuleTable("cuda views", needs=lambda op: op.name in VIEW_OPS)
VIEWS.add("reshape", lambda node, source: lambda view: reshape(view, source.shape, node.shape))
VIEWS.add("transpose", lambda node, source: lambda view: transpose(view, source.shape, node.attrs["perm"]))
VIEWS.add("slice", lambda node, source: lambda view: slice_axis(view, source.shape, node.attrs["axis"],
                                                                  node.attrs["start"], node.attrs["stop"]))
VIEWS.add("broadcast", lambda node, source: lambda view: broadcast(view, source.shape, node.shape))
