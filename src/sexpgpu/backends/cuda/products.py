"""Products: their lowering, and the implementations of a long float32 product.

A product is a launch of PyTorch's (cuBLAS's kernel for each shape is what the device decides):
float32 operands give an ordinary GEMM with TF32 and reduced-precision reductions off
(device.py), bf16 operands a GEMM accumulating in float32 rounded once to bf16, leading axes a
batched product. The plan picks one implementation per float32 ProductShape (`ordinary`,
`transposed`, `split-k N`; docs/cuda.md, "Float32 product implementations", says what each
does) and hands {ProductShape.key(): implementation} over in the FusionPolicy; the backend
never chooses, and runs `ordinary` for every shape the map does not name. Each sums in a
fixed order, so each repeats its bits run to run; two implementations round differently.
"""

from __future__ import annotations

from dataclasses import dataclass

from sexpgpu.backends.cuda.launches import TorchLaunch
from sexpgpu.backends.cuda.views import reshape_strides
from sexpgpu.graph.core.rules import RuleTable
from sexpgpu.plan.device import ProductShape

ORDINARY = "ordinary"
TRANSPOSED = "transposed"
SPLITS = (2, 4)
SPLIT_MIN_SLICE = 256  # a shorter slice of K makes a product too short for a split to pay


def split_name(parts: int) -> str:
    return f"split-k {parts}"


def implementations(shape: ProductShape) -> tuple:
    """The implementations this backend runs for `shape`, ordinary first."""
    legal = [split_name(parts) for parts in SPLITS if shape.k % parts == 0 and shape.k // parts >= SPLIT_MIN_SLICE]
    return (ORDINARY, TRANSPOSED, *legal)


def check_implementation(shape: ProductShape, implementation: str) -> None:
    """A ValueError when the plan hands over an implementation this shape cannot run."""
    if implementation not in implementations(shape):
        raise ValueError(f"product {shape.key()}: '{implementation}' is not one of {', '.join(implementations(shape))}")


def split_parts(implementation: str) -> int:
    return int(implementation.split()[-1]) if implementation.startswith("split-k ") else 1


def matrix_layout(view) -> bool:
    """Whether a view's last two axes hold a transposed (column-major) matrix."""
    return len(view.dims) >= 2 and view.strides[-2] == 1 and view.strides[-1] != 1 and view.dims[-2] != 1


def product_shape(rows: int, batch: int, shape: tuple, k: int, left_view, right_view) -> ProductShape:
    return ProductShape(m=rows, n=int(shape[-1]), k=int(k), batch=batch,
                        a_transposed=matrix_layout(left_view), b_transposed=matrix_layout(right_view))


def scratch_shape(implementation: str, shape: ProductShape) -> tuple | None:
    """The float32 scratch an implementation writes besides the result (None: none)."""
    if implementation == TRANSPOSED:
        return (shape.batch, shape.n, shape.m)
    parts = split_parts(implementation)
    return (parts, shape.batch, shape.m, shape.n) if parts > 1 else None


def run_product(implementation: str, a, b, out, scratch) -> None:
    """out = a @ b for a (batch, m, k), b (batch, k, n), out (batch, m, n) contiguous."""
    if implementation == TRANSPOSED:
        # a column-major result: cuBLAS gets the operands in the other order and layout
        target = scratch.transpose(1, 2)
        _product(a, b, target)
        out.copy_(target)
        return
    parts = split_parts(implementation)
    width = a.shape[-1] // parts
    for index in range(parts):
        terms = slice(index * width, (index + 1) * width)
        _product(a[:, :, terms], b[:, terms, :], scratch[index])
    # imported at the first split, not with the module: Triton reads TRITON_INTERPRET when
    # it decorates a kernel, as for the scatter kernel (gathers.py)
    from sexpgpu.backends.cuda.partial_sums import sum_partials

    sum_partials(scratch, out)


def _product(a, b, out) -> None:
    import torch

    if a.shape[0] == 1:  # one product: a GEMM, as the ordinary lowering calls it
        torch.mm(a[0], b[0], out=out[0])
    else:
        torch.bmm(a, b, out=out)


# --- the lowering --------------------------------------------------------------------------------


PRODUCTS = RuleTable("cuda products", needs=lambda op: op.kind == "contract")


@PRODUCTS.rule("matmul")
def matmul(lowerer, node) -> None:
    left, right = lowerer.operands(node.inputs)
    key = lowerer.result_buffer(node)
    form = _product_form(left.view, right.view, node.shape)
    implementation = ORDINARY
    if form.shape is not None and node.dtype == "f32":  # the plan's choice for a float32 product
        implementation = lowerer.policy.products.get(form.shape.key(), ORDINARY)
    writes = (key,)
    if implementation != ORDINARY:
        check_implementation(form.shape, implementation)
        writes += (lowerer.new_buffer("f32", scratch_shape(implementation, form.shape)),)

    def run(env):
        tensors = left.strided(env), right.strided(env), env[key]
        if implementation == ORDINARY:
            form.call(*tensors)
        else:
            run_product(implementation, *form.batched(*tensors), env[writes[1]])

    choosable = form.shape if node.dtype == "f32" else None
    lowerer.emit_result(node, TorchLaunch(run, (left.key, right.key), writes, "matmul", product=choosable))


@dataclass(frozen=True)
class ProductForm:
    call: object  # call(a, b, out): the ordinary product, written into `out`
    shape: ProductShape | None  # the product as the plan sees it; None: no other implementation
    batched: object = None  # batched(a, b, out) -> (batch, m, k), (batch, k, n), (batch, m, n) views


def _product_form(left_view, right_view, shape) -> ProductForm:
    """The PyTorch call that writes a product straight into its buffer: one GEMM (`mm`)
    when the left operand's leading axes fold into its rows as a view and the right one is
    a matrix, a strided batched GEMM (`bmm`) when both operands have the product's batch
    axes, and torch.matmul (batch axes broadcast) otherwise.

    A batched operand whose batch axes do not fold into one (attention's heads, read from
    a (batch, position, head, dim) buffer) is first copied into a contiguous one: that copy
    reads a few MB, while torch.matmul would also route the whole product through a
    temporary."""
    import torch

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
