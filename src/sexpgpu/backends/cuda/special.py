"""Ops that read or write memory in ways an elementwise kernel does not: products (cuBLAS
through PyTorch), gathers and their scatters, pads and concatenations; with the window ops
(windows.py), the fused attention (attention.py) and the draws (draws.py).

Products: float32 operands give an ordinary GEMM with TF32 and reduced-precision
reductions off (device.py), bf16 operands a GEMM accumulating in float32 rounded once to
bf16, and leading axes a batched product. cuBLAS's kernel for each shape is chosen by
cuBLAS from the GPU and its version (the spec's "what the device decides"). A float32
product may run another implementation that the plan chose for its shape (products.py).
"""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass

from sexpgpu.backends.cuda.codegen.space import View, contiguous, contiguous_strides
from sexpgpu.backends.cuda.products import ORDINARY, check_implementation, product_shape, run_product, scratch_shape
from sexpgpu.plan.device import ProductShape
from sexpgpu.backends.cuda.steps import TorchStep, same_memory, strided


def matmul(lowerer, node) -> None:
    a, b = node.inputs
    left, left_view = lowerer.addressable(a)
    right, right_view = lowerer.addressable(b)
    key = lowerer.result_buffer(node)
    form = _product(left_view, right_view, node.shape)
    implementation = ORDINARY
    if form.shape is not None and node.dtype == "f32":  # the plan's choice for a float32 product
        implementation = lowerer.policy.products.get(form.shape.key(), ORDINARY)
    writes = (key,)
    if implementation != ORDINARY:
        check_implementation(form.shape, implementation)
        writes += (lowerer.new_buffer("f32", scratch_shape(implementation, form.shape)),)

    def run(env):
        operands = strided(env, left, left_view), strided(env, right, right_view), env[key]
        if implementation == ORDINARY:
            form.call(*operands)
        else:
            run_product(implementation, *form.batched(*operands), env[writes[1]])

    choosable = form.shape if node.dtype == "f32" else None
    lowerer.steps.append(TorchStep(run, (left, right), writes, "matmul", product=choosable))
    lowerer.values[node] = lowerer.loaded(node, key)


@dataclass(frozen=True)
class ProductForm:
    call: object  # call(a, b, out): the ordinary product, written into `out`
    shape: ProductShape | None  # the product as the plan sees it; None: no other implementation
    batched: object = None  # batched(a, b, out) -> (batch, m, k), (batch, k, n), (batch, m, n) views


def _product(left_view, right_view, shape) -> ProductForm:
    """The PyTorch call that writes a product straight into its buffer: one GEMM (`mm`)
    when the left operand's leading axes fold into its rows as a view and the right one is
    a matrix, a strided batched GEMM (`bmm`) when both operands have the product's batch
    axes, and torch.matmul (batch axes broadcast) otherwise.

    A batched operand whose batch axes do not fold into one (attention's heads, read from
    a (batch, position, head, dim) buffer) is first copied into a contiguous one: that copy
    reads a few MB, while torch.matmul would also route the whole product through a
    temporary."""
    import torch

    from sexpgpu.backends.cuda.views import reshape_strides

    rows = 1
    for size in shape[:-1]:
        rows *= int(size)
    k = left_view.dims[-1]
    n = int(shape[-1])
    if len(right_view.dims) == 2 and reshape_strides(left_view.dims, left_view.strides, (rows, k)) is not None:
        return ProductForm(
            lambda a, b, out: torch.mm(a.reshape(rows, k), b, out=out.view(rows, n)),
            product_shape(rows, 1, shape, k, left_view, right_view),
            lambda a, b, out: (a.reshape(1, rows, k), b.unsqueeze(0), out.view(1, rows, n)),
        )
    batch = 1
    for size in shape[:-2]:
        batch *= int(size)
    if left_view.dims[:-2] == right_view.dims[:-2] == tuple(shape[:-2]):
        matrices = (batch,) + tuple(shape[-2:])

        def batched(a, b, out):
            return _batch_operand(a, batch), _batch_operand(b, batch), out.view(matrices)

        def ordinary(a, b, out):
            torch.bmm(*batched(a, b, out)[:2], out=out.view(matrices))

        return ProductForm(ordinary, product_shape(int(shape[-2]), batch, shape, k, left_view, right_view), batched)
    return ProductForm(lambda a, b, out: torch.matmul(a, b, out=out), None)


def _batch_operand(x, batch: int):
    """`x` (..., m, k) as (batch, m, k): a view when its batch axes fold, else a contiguous
    copy, made in the transposed order when x is a transposed matrix (cuBLAS then reads it
    transposed, and the copy writes along x's own unit stride)."""
    matrix = tuple(x.shape[-2:])
    if x.dim() >= 2 and x.stride(-2) == 1 and x.stride(-1) != 1:
        flipped = x.transpose(-1, -2).reshape((batch, matrix[1], matrix[0]))
        return flipped.transpose(1, 2)
    return x.reshape((batch,) + matrix)


def gather(lowerer, node) -> None:
    import torch

    table, ids = node.inputs
    rows, rows_view = lowerer.addressable(table)
    index, index_view = lowerer.addressable(ids)
    key = lowerer.result_buffer(node)
    row_shape = tuple(table.shape[1:])

    def run(env):
        picked = strided(env, index, index_view).reshape(-1)
        torch.index_select(strided(env, rows, rows_view), 0, picked, out=env[key].view((-1,) + row_shape))

    lowerer.steps.append(TorchStep(run, (rows, index), (key,), "gather"))
    lowerer.values[node] = lowerer.loaded(node, key)


def scatter_add(lowerer, node) -> None:
    from sexpgpu.backends.cuda.codegen.scatter import scatter_add as scatter

    ids, values = node.inputs
    index, index_view = lowerer.addressable(ids)
    source, source_view = lowerer.addressable(values)
    key = lowerer.result_buffer(node)

    def run(env):
        scatter(strided(env, index, index_view), strided(env, source, source_view).contiguous(), env[key])

    lowerer.steps.append(TorchStep(run, (index, source), (key,), "scatter"))
    lowerer.values[node] = lowerer.loaded(node, key)


def pad(lowerer, node) -> None:
    (x,) = node.inputs
    source, view = lowerer.addressable(x)
    key = lowerer.result_buffer(node)
    axis, before = node.attrs["axis"], node.attrs["before"]

    def run(env):
        out = env[key]
        out.zero_()
        out.narrow(axis, before, x.shape[axis]).copy_(strided(env, source, view))

    lowerer.steps.append(TorchStep(run, (source,), (key,), "pad"))
    lowerer.values[node] = lowerer.loaded(node, key)


def concat(lowerer, node) -> None:
    parts = [lowerer.addressable(source) for source in node.inputs]
    key = lowerer.result_buffer(node)
    axis = node.attrs["axis"]
    starts = np.cumsum([0] + [source.shape[axis] for source in node.inputs]).tolist()
    run = _concatenation(parts, [tuple(source.shape) for source in node.inputs], key, axis, starts)
    aliases = tuple(_place_in(lowerer.buffers[source], key, node.shape, axis, start) for (source, view), start
                    in zip(parts, starts) if _placeable(lowerer.buffers[source], view, node.shape, axis))
    lowerer.buffers[key].live_from_start = bool(aliases)
    lowerer.steps.append(TorchStep(run, tuple(dict.fromkeys(source for source, _ in parts)), (key,), "concat",
                                   aliases=aliases))
    lowerer.values[node] = lowerer.loaded(node, key)


def _placeable(buffer, view, shape, axis: int) -> bool:
    """Whether an input read whole, in its own order, can lie at its slice of the result:
    it can when the slices along `axis` are contiguous runs of the result."""
    whole = int(np.prod(view.dims)) == int(np.prod(buffer.shape)) and view == contiguous(view.dims)
    return buffer.kind == "input" and whole and int(np.prod(shape[:axis])) == 1


def _place_in(buffer, key: str, shape, axis: int, start: int):
    """(the input, the result, the input's place in the result, over the input's shape)."""
    return buffer.key, key, View(buffer.shape, contiguous_strides(buffer.shape), start * contiguous_strides(shape)[axis])


def _concatenation(parts, shapes, key: str, axis: int, starts: list):
    """The run of a concatenation: torch.cat, or, when some parts already lie at their
    place in the result (placement.py), a copy of the others alone. Each part is read in
    its node's shape: a part's view may keep its source's, as a 0-d value reshaped to (1,)."""
    import torch

    def run(env):
        out = env[key]
        sources = [strided(env, source, view).reshape(shape) for (source, view), shape in zip(parts, shapes)]
        targets = [out.narrow(axis, start, piece.shape[axis]) for start, piece in zip(starts, sources)]
        moved = [(target, piece) for target, piece in zip(targets, sources) if not same_memory(target, piece)]
        if len(moved) == len(sources):
            torch.cat(sources, dim=axis, out=out)
        elif moved:
            torch._foreach_copy_([target for target, _ in moved], [piece for _, piece in moved])

    return run


from sexpgpu.backends.cuda.attention import ATTENTION  # noqa: E402
from sexpgpu.backends.cuda.draws import DRAWS  # noqa: E402
from sexpgpu.backends.cuda.windows import WINDOWS  # noqa: E402

SPECIAL = {
    **WINDOWS,
    **ATTENTION,
    **DRAWS,
    "matmul": matmul,
    "gather": gather,
    "scatter_add": scatter_add,
    "pad": pad,
    "concat": concat,
}
