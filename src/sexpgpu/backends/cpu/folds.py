"""Sums and products in a fixed order, vectorised across output elements.

Every sum here is a sequential left fold: `acc = x[0]; acc = acc + x[i]` for i = 1, 2, ...,
each addition rounded to the array's dtype. Nothing uses np.sum, np.dot, np.matmul or
np.einsum, nor np.add.reduce along an array's fastest-varying axis: their order depends on
numpy's pairwise blocking, SIMD width and BLAS, which depend on the machine.

Orders:
- `reduce_sum(x, axes)`: each output element folds its inputs in the C order of the reduced
  axes (the last reduced axis varies fastest), starting from the first of them. A float sum
  over trailing axes that is NaN is the quiet NaN of positive sign and no payload.
- `matmul(a, b)`: out[..., m, n] = fold over k = 0 .. K-1 of (a[..., m, k] * b[..., k, n]),
  each product rounded, then added: acc = p0, acc = acc + p1, ... (no fused multiply-add).
  A NaN result is the quiet NaN of positive sign and no payload (native.py says why).
- `reduce_max(x, axes)`: IEEE 754-2019 maximum, which does not depend on order: any NaN
  gives NaN, and +0 counts as larger than -0.

How they are computed (every form gives the same bits; the choice is only speed):
- `np.add.reduce(rows, axis=0, initial=-0.0)` on a C-contiguous (R, W) array with W >= 2.
  numpy reduces a leading axis row by row: each row is added into the running result, one
  IEEE addition per element, vectorised across the W outputs; its pairwise summation is
  used only along the fastest-varying axis (numpy's documentation of np.sum). Starting
  from -0 changes nothing, as -0 + x == x for every x, +0 included. `LEADING_REDUCE_FOLDS`
  checks this at import on terms whose sum has other bits in any other order; if numpy ever
  answered otherwise, the folds below fall back to one `np.add` per row.
- `np.add.accumulate` along the summed axis, which numpy defines as the running sequential
  sum: for a single output element (W = 1), where a reduce would run along the fast axis.
- A float sum over the trailing axes (a softmax's, a layernorm's, a whole array's) folds
  each output's contiguous terms in a compiled loop (native.fold_last_axis), no transpose.
- A product is folded by a compiled kernel (native.py), each multiply and each add rounded
  on its own, vectorised across a row's outputs. float32: in register tiles, 4 rows by 64
  (or 16) columns of running sums held in vector registers for the whole fold over k, in
  order (a single row, and columns left over, where no tile fits). float64 (the test
  oracle): for each output row p0 + p1 (the fold's first sum) is stored, then the later k's
  products are added to the row of running sums, two k's per pass over the row. Rows go
  to threads (parallel.py) in groups; each output is folded by one thread, so neither the
  split nor the thread count changes a bit. A product whose rows are short folds its
  transpose, b^T a^T, the same terms in the same order.
"""

from __future__ import annotations

import math

import numpy as np

from sexpgpu.backends.cpu.parallel import run_ranges

NARROW = 16  # output rows shorter than a float32 register tile (and than the columns) fold the transposed product
# work from which a kernel's outputs go to threads: a split costs each thread tens of
# microseconds of CPU time (waking it, waiting for it, moving the data to its core), so
# each piece should take a few hundred
THREADED = 1 << 24  # products (M * N * K): a few hundred microseconds in register tiles
SUM_THREADED = 1 << 22  # terms of a trailing sum


def _native():
    """native.py, imported at the first compiled fold: numba's import and its cache cost a
    process half a second, which one that compiles or checks a file without running it never pays."""
    from sexpgpu.backends.cpu import native

    return native


def _sequential_fold_by_rows(rows: np.ndarray) -> np.ndarray:
    acc = rows[0].copy()
    for index in range(1, rows.shape[0]):
        np.add(acc, rows[index], out=acc)
    return acc


def _check_leading_reduce() -> bool:
    """Does np.add.reduce over a leading axis give the left fold's bits? Column 0 is 1
    followed by 63 halves of 1's ulp (left to right each addition rounds back to 1), column
    1 the same terms reversed, column 2 all -0; any other order or start gives other bits."""
    terms = np.full((64, 3), 2.0**-24, np.float32)
    terms[0, 0] = terms[-1, 1] = 1.0
    terms[:, 2] = -0.0
    with np.errstate(all="ignore"):
        got = np.add.reduce(terms, axis=0, initial=np.float32(-0.0))
    return got.tobytes() == _sequential_fold_by_rows(terms).tobytes()


LEADING_REDUCE_FOLDS = _check_leading_reduce()


def fold_into(rows: np.ndarray, out: np.ndarray) -> None:
    """out[...] = rows[0] + rows[1] + ... + rows[R-1], folded left to right; `rows` is a
    C-contiguous (R, *out.shape) array, R >= 1, of out's dtype; `out` may be a strided view."""
    if out.size >= 2 and LEADING_REDUCE_FOLDS:
        zero = rows.dtype.type(-0.0) if rows.dtype.kind == "f" else rows.dtype.type(0)
        np.add.reduce(rows, axis=0, initial=zero, out=out)
    elif out.size >= 2:
        out[...] = _sequential_fold_by_rows(rows)
    else:
        out[...] = np.add.accumulate(rows.reshape(-1), dtype=rows.dtype)[-1]


def fold_rows(rows: np.ndarray) -> np.ndarray:
    """rows[0] + rows[1] + ... + rows[R-1], folded left to right; R >= 1."""
    if rows.shape[0] == 1:
        return rows[0].copy()
    out = np.empty(rows.shape[1:], rows.dtype)
    fold_into(np.ascontiguousarray(rows), out)
    return out


def _to_rows(x: np.ndarray, axes: tuple) -> tuple[np.ndarray, tuple]:
    """x with its reduced axes flattened (C order) in front, and the kept axes' shape."""
    kept = tuple(axis for axis in range(x.ndim) if axis not in axes)
    moved = np.transpose(x, axes + kept)
    count = 1
    for axis in axes:
        count *= x.shape[axis]
    kept_shape = tuple(x.shape[axis] for axis in kept)
    return np.ascontiguousarray(moved).reshape((count,) + kept_shape), kept_shape


def _shape_out(x: np.ndarray, axes: tuple, keep: bool) -> tuple:
    if keep:
        return tuple(1 if axis in axes else dim for axis, dim in enumerate(x.shape))
    return tuple(dim for axis, dim in enumerate(x.shape) if axis not in axes)


def reduce_sum(x: np.ndarray, axes: tuple, keep: bool = False) -> np.ndarray:
    axes = tuple(axes)
    if not axes:
        return x.copy()
    if x.size and x.dtype.kind == "f" and axes == tuple(range(x.ndim - len(axes), x.ndim)):
        return _fold_trailing(x, len(axes)).reshape(_shape_out(x, axes, keep))
    rows, _ = _to_rows(x, axes)
    if rows.shape[0] == 0:
        return np.zeros(_shape_out(x, axes, keep), x.dtype)
    return fold_rows(rows).reshape(_shape_out(x, axes, keep))


def add_rows_at(ids: np.ndarray, values: np.ndarray, out: np.ndarray) -> None:
    """out[ids[i]] += values[i] for i = 0, 1, ... in order: each row of out folds, from the value
    it holds, the rows of values whose id names it, in their order (a compiled loop: np.add.at's
    order, at a fraction of its cost). values (N, W) and out (R, W) C-contiguous, ids in range."""
    _native().add_rows_at(ids, values, out)


def _fold_trailing(x: np.ndarray, count: int) -> np.ndarray:
    """The folds over x's last `count` axes, each output's terms contiguous in memory."""
    width = math.prod(x.shape[x.ndim - count:])
    rows = _read_only(np.ascontiguousarray(x).reshape(-1, width))
    out = np.empty(rows.shape[0], x.dtype)
    fold = _native().fold_last_axis
    run_ranges(lambda first, stop: fold(rows, out, first, stop), rows.shape[0], x.size if x.size >= SUM_THREADED else 0)
    return out


def _read_only(x: np.ndarray) -> np.ndarray:
    """A read-only view: writable or not, a kernel sees one type, so it has one specialisation."""
    view = x.view()
    view.flags.writeable = False
    return view


def ieee_maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise IEEE 754-2019 maximum: NaN wins, and +0 > -0."""
    result = np.maximum(a, b)
    both_zero = (a == 0) & (b == 0)
    if np.any(both_zero):
        negative = np.signbit(a) & np.signbit(b)
        result = np.where(both_zero, np.where(negative, -0.0, 0.0).astype(result.dtype), result)
    return result


def ieee_minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise IEEE 754-2019 minimum: NaN wins, and -0 < +0."""
    result = np.minimum(a, b)
    both_zero = (a == 0) & (b == 0)
    if np.any(both_zero):
        negative = np.signbit(a) | np.signbit(b)
        result = np.where(both_zero, np.where(negative, -0.0, 0.0).astype(result.dtype), result)
    return result


def reduce_max(x: np.ndarray, axes: tuple, keep: bool = False) -> np.ndarray:
    axes = tuple(axes)
    if not axes:
        return x.copy()
    result = np.max(x, axis=axes, keepdims=keep)  # the value does not depend on the order
    if np.issubdtype(x.dtype, np.floating):
        zero = result == 0
        if np.any(zero):
            has_positive_zero = np.any((x == 0) & ~np.signbit(x), axis=axes, keepdims=keep)
            result = np.where(zero, np.where(has_positive_zero, 0.0, -0.0).astype(x.dtype), result)
    return np.asarray(result, dtype=x.dtype)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., M, K) x (..., K, N) -> (..., M, N), leading dims broadcast; the fold is over k."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    dtype = a.dtype if a.dtype == b.dtype else np.result_type(a.dtype, b.dtype)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out_shape = batch + (m, n)
    if k == 0 or 0 in out_shape:
        return np.zeros(out_shape, dtype)
    if b.ndim == 2 and a.ndim > 2:  # one weight for the whole batch: its rows are more output rows
        return matmul(a.reshape(-1, k), b).reshape(out_shape)
    if n < NARROW and m > n:  # short rows vectorise poorly: fold the transposed product, b^T a^T
        # returned as a transposed view: every reader takes any strides (a product's left
        # operand is read in place), and a copy to C order would cost a pass over it
        return matmul(b.swapaxes(-1, -2), a.swapaxes(-1, -2)).swapaxes(-1, -2)
    left = _batched(a, batch, dtype)  # read in place, whatever its strides
    if any(stride % left.itemsize for stride in left.strides):  # the kernels step by whole elements
        left = _read_only(np.ascontiguousarray(left))
    right = _read_only(np.ascontiguousarray(_batched(b, batch, dtype)))  # its rows are the vectorised loads
    out = np.empty((math.prod(batch), m, n), dtype)
    native = _native()
    groups = -(-out.shape[0] * m // native.ROW_GROUP)

    fold = native.fold_product_tiles if dtype == np.float32 else native.fold_products

    def work(first: int, last: int) -> None:
        stop = min(last * native.ROW_GROUP, out.shape[0] * m)
        fold(left, right, out, first * native.ROW_GROUP, stop)

    run_ranges(work, groups, out.size * k if out.size * k >= THREADED else 0)
    return out.reshape(out_shape)


def _batched(x: np.ndarray, batch: tuple, dtype) -> np.ndarray:
    """x (..., R, C) as a read-only (B, R, C) of `dtype`, a view where it can be: B is 1 when x
    has no batch dims of its own (the kernel broadcasts it), else x broadcast to the whole batch."""
    rows, cols = x.shape[-2:]
    if math.prod(x.shape[:-2]) != 1:
        x = np.broadcast_to(x, batch + (rows, cols))
    return _read_only(x.reshape(-1, rows, cols).astype(dtype, copy=False))
