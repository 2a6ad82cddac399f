"""Sums and products in a fixed order, vectorised across output elements.

Every sum here is a sequential left fold: `acc = x[0]; acc = acc + x[i]` for i = 1, 2, ...,
each addition rounded to the array's dtype. Nothing uses np.sum, np.dot, np.matmul or
np.einsum, nor np.add.reduce along an array's fastest-varying axis: their order depends on
numpy's pairwise blocking, SIMD width and BLAS, which depend on the machine.

Orders:
- `reduce_sum(x, axes)`: each output element folds its inputs in the C order of the reduced
  axes (the last reduced axis varies fastest), starting from the first of them.
- `matmul(a, b)`: out[..., m, n] = fold over k = 0 .. K-1 of (a[..., m, k] * b[..., k, n]),
  each product rounded, then added: acc = p0, acc = acc + p1, ... (no fused multiply-add).
- `reduce_max(x, axes)`: IEEE 754-2019 maximum, which does not depend on order: any NaN
  gives NaN, and +0 counts as larger than -0.

How numpy computes the fold (every form gives the same bits; the choice is only speed):
- `np.add.reduce(rows, axis=0, initial=-0.0)` on a C-contiguous (R, W) array with W >= 2.
  numpy reduces a leading axis row by row: each row is added into the running result, one
  IEEE addition per element, vectorised across the W outputs; its pairwise summation is
  used only along the fastest-varying axis (numpy's documentation of np.sum). Starting
  from -0 changes nothing, as -0 + x == x for every x, +0 included. `LEADING_REDUCE_FOLDS`
  checks this at import on terms whose sum has other bits in any other order; if numpy ever
  answered otherwise, the folds below fall back to one `np.add` per row.
- `np.add.accumulate` along the summed axis, which numpy defines as the running sequential
  sum: for a single output element (W = 1), where a reduce would run along the fast axis.
- A product is folded in blocks of k: one broadcast multiply forms a block's products for a
  tile of outputs in a scratch buffer whose row 0 holds the tile's running sums, and one
  leading-axis reduce continues the fold through them, ((acc + p[k0]) + p[k0+1]) + ...;
  that is the same left fold, cut into pieces (tiles of outputs, blocks of k) whose sizes
  change no bit. Tiles may go to threads (parallel.py): each output is folded by one thread.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import numpy as np

from sexpgpu.backends.cpu.parallel import run_ranges

TILE = 1 << 15  # output elements folded together (a tile of the product's output)
BLOCK = 1 << 18  # products formed at once for a tile (elements of the scratch buffer)
# Measured with numpy 2.4: a broadcast multiply whose rows are shorter than about half of
# `np.getbufsize()` elements is copied through buffers, 2-3x slower; with SHORT_BUFFER,
# rows of LONG_ROW or more run unbuffered. Buffering moves data, it never changes a result.
LONG_ROW = 128
SHORT_BUFFER = 256
THREADED = 1 << 21  # products (M * N * K) from which a product's tiles go to threads


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
    rows, _ = _to_rows(x, axes)
    if rows.shape[0] == 0:
        return np.zeros(_shape_out(x, axes, keep), x.dtype)
    return fold_rows(rows).reshape(_shape_out(x, axes, keep))


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
    plain = a.ndim == 2 and b.ndim == 2
    if plain and k and 2 <= m * n and m * n * k <= BLOCK:
        return _small_matmul(a, b, dtype)
    batch = () if plain else np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out_shape = batch + (m, n)
    if k == 0 or 0 in out_shape:
        return np.zeros(out_shape, dtype)
    if b.ndim == 2 and a.ndim > 2:  # one weight for the whole batch: its rows are more output rows
        return matmul(a.reshape(-1, k), b).reshape(out_shape)
    left = _k_major(a.swapaxes(-1, -2), batch, dtype)  # (K, Ba, M): Ba is 1 or the whole batch
    right = _k_major(b, batch, dtype)  # (K, Bb, N)
    transposed = m > n  # the longer of M, N varies fastest: numpy's inner loops get longer
    rows, cols = (right, left) if transposed else (left, right)
    out = np.empty((math.prod(batch), rows.shape[-1], cols.shape[-1]), dtype)
    _fold_products(rows, cols, out)
    if transposed:
        out = np.ascontiguousarray(out.swapaxes(-1, -2))
    return out.reshape(out_shape)


def _small_matmul(a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """The same fold for a product small enough to form all its products at once."""
    (m, k), n = a.shape, b.shape[1]
    if m > n:  # laid out (n, m), so that numpy's inner loops run over the longer side
        terms = _scratch(k * n * m, dtype).reshape(k, n, m)
        with _buffers_for_rows(m):
            np.multiply(b[:, :, None], a.T[:, None, :], out=terms)
        out = np.empty((n, m), dtype)
        fold_into(terms, out)
        return out.T.copy()
    terms = _scratch(k * m * n, dtype).reshape(k, m, n)
    with _buffers_for_rows(n):
        np.multiply(a.T[:, :, None], b[:, None, :], out=terms)
    out = np.empty((m, n), dtype)
    fold_into(terms, out)
    return out


@contextmanager
def _buffers_for_rows(length: int):
    """numpy's ufunc buffer size for broadcast multiplies of rows this long (see SHORT_BUFFER)."""
    if length < LONG_ROW:
        yield
        return
    saved = np.setbufsize(SHORT_BUFFER)
    try:
        yield
    finally:
        np.setbufsize(saved)


def _k_major(x: np.ndarray, batch: tuple, dtype) -> np.ndarray:
    """x (..., K, C) as a contiguous (K, B, C): B is 1 when x has no batch dims of its own,
    else x broadcast to the whole batch, flattened."""
    k, c = x.shape[-2], x.shape[-1]
    if math.prod(x.shape[:-2]) == 1:
        x = x.reshape(1, k, c)
    else:
        x = np.broadcast_to(x, batch + (k, c)).reshape(-1, k, c)
    return np.ascontiguousarray(x.transpose(1, 0, 2), dtype=dtype)


def _tiles(batches: int, rows: int, cols: int) -> list:
    """(batch, row, column) slices covering the output, each about TILE elements."""
    col_step = min(cols, TILE)
    row_step = min(rows, max(1, TILE // col_step))
    batch_step = max(1, TILE // (row_step * col_step)) if row_step == rows else 1
    return [(slice(b, min(b + batch_step, batches)), slice(r, min(r + row_step, rows)),
             slice(c, min(c + col_step, cols)))
            for b in range(0, batches, batch_step) for r in range(0, rows, row_step) for c in range(0, cols, col_step)]


def _fold_products(rows: np.ndarray, cols: np.ndarray, out: np.ndarray) -> None:
    """out[b, r, c] = fold over k of rows[k, b, r] * cols[k, b, c] (a batch of 1 broadcasts)."""
    k = rows.shape[0]
    tiles = _tiles(*out.shape)

    def work(first: int, last: int) -> None:
        with _buffers_for_rows(min(out.shape[-1], TILE)):  # numpy's setting is per thread
            for batch, row, col in tiles[first:last]:
                left = rows[:, batch if rows.shape[1] > 1 else slice(0, 1), row, None]
                right = cols[:, batch if cols.shape[1] > 1 else slice(0, 1), None, col]
                _fold_tile(left, right, out[batch, row, col], k)

    elements = out.size * k
    run_ranges(work, len(tiles), elements if elements >= THREADED else 0)


def _fold_tile(left: np.ndarray, right: np.ndarray, out: np.ndarray, k: int) -> None:
    """out = fold over k of left[k] * right[k] (broadcast to out's shape), in blocks of k."""
    width = out.size
    block = max(1, min(k, BLOCK // width))
    buffers = _scratch(2 * (block + 1) * width, out.dtype).reshape((2, block + 1) + out.shape)
    current = 0
    for start in range(0, k, block):
        stop = min(k, start + block)
        terms = buffers[current, : stop - start + 1]
        np.multiply(left[start:stop], right[start:stop], out=terms[1:])
        if start == 0:
            terms = terms[1:]  # the fold starts at the first product
        current = 1 - current
        fold_into(terms, out if stop == k else buffers[current, 0])


_local = threading.local()


def _scratch(size: int, dtype) -> np.ndarray:
    """A reusable flat buffer of this thread (fresh arrays would be paged in on every call)."""
    key = np.dtype(dtype).str
    pool = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = {}
    buffer = pool.get(key)
    if buffer is None or buffer.size < size:
        buffer = pool[key] = np.empty(max(size, 2 * BLOCK + 2 * TILE), dtype)
    return buffer[:size]
