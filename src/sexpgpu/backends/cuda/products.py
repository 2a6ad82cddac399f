"""The implementations of a long float32 product, one of which the plan picks per shape
(plan/choices.py; determinism.md, "What a run chooses"). The backend never chooses: it is
given {ProductShape.key(): implementation} in its FusionPolicy and runs `ordinary` for every
shape the map does not name. Each implementation sums in a fixed order, so each repeats its
bits run to run; two implementations round differently.

- `ordinary`: the product as PyTorch hands it to cuBLAS (a pedantic float32 GEMM into the
  row-major result, which cuBLAS, column-major, computes as C^T = B^T A^T).
- `transposed`: the other operand order: cuBLAS computes C = A B into a column-major scratch
  (C^T stored), which one copy turns into the row-major result.
- `split-k N` (N in 2, 4; legal when N divides K and each slice has at least
  SPLIT_MIN_SLICE terms): N products over consecutive slices of K into a scratch of N
  partial results, then one kernel sums them element by element as ((p0 + p1) + p2) + p3,
  with no atomics.

Only products whose operands fold into (batch, m, k) and (batch, k, n) views, or a matrix
times a matrix, have a ProductShape and so a choice; a product that broadcasts its batch
axes, or a bf16 one, is always ordinary.
"""

from __future__ import annotations

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
    # it decorates a kernel, as for the scatter kernel (special.py)
    from sexpgpu.backends.cuda.partial_sums import sum_partials

    sum_partials(scratch, out)


def _product(a, b, out) -> None:
    import torch

    if a.shape[0] == 1:  # one product: a GEMM, as the ordinary lowering calls it
        torch.mm(a[0], b[0], out=out[0])
    else:
        torch.bmm(a, b, out=out)
