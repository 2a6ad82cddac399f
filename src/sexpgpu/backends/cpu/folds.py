"""Sums and products in a fixed order, vectorised across output elements.

Every sum here is a sequential left fold: `acc = x[0]; acc = acc + x[i]` for i = 1, 2, ...,
each addition rounded to the array's dtype. Nothing uses np.sum, np.add.reduce, np.dot,
np.matmul or np.einsum: their order depends on numpy's pairwise blocking, SIMD width and
BLAS, which depend on the machine.

Two numpy forms compute exactly that fold:
- a Python loop over the summed index, each step one vectorised `np.add` across every
  output element (fast when there are many output elements);
- `np.add.accumulate` along the summed axis, which numpy defines as the running sequential
  sum (fast when there are few output elements and many terms).
Both give the same bits; `fold_rows` picks by width only for speed.

Orders:
- `reduce_sum(x, axes)`: each output element folds its inputs in the C order of the reduced
  axes (the last reduced axis varies fastest), starting from the first of them.
- `matmul(a, b)`: out[..., m, n] = fold over k = 0 .. K-1 of (a[..., m, k] * b[..., k, n]),
  each product rounded, then added: acc = p0, acc = acc + p1, ... (no fused multiply-add).
- `reduce_max(x, axes)`: IEEE 754-2019 maximum, which does not depend on order: any NaN
  gives NaN, and +0 counts as larger than -0.
"""

from __future__ import annotations

import math

import numpy as np

from sexpgpu.backends.cpu.parallel import run_ranges

WIDE = 128  # output elements from which a Python loop over the summed index is faster
CHUNK = 1 << 16  # products formed at once (elements) before they are folded
LARGE = 1 << 14  # output elements from which products are formed one k at a time
CACHE_BLOCK = 1 << 16  # output elements folded together when they are formed one k at a time


def fold_rows(rows: np.ndarray) -> np.ndarray:
    """rows[0] + rows[1] + ... + rows[R-1], folded left to right; R >= 1."""
    count = rows.shape[0]
    if count == 1:
        return rows[0].copy()
    if rows[0].size >= WIDE:
        acc = rows[0].copy()
        for index in range(1, count):
            np.add(acc, rows[index], out=acc)
        return acc
    return np.add.accumulate(rows, axis=0, dtype=rows.dtype)[-1]


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
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out_shape = batch + (m, n)
    if k == 0:
        return np.zeros(out_shape, a.dtype)
    # left[k] * right[k] is the k-th product of every output element, by broadcasting
    left = _lead_k(a.swapaxes(-1, -2), len(batch))[..., :, None]  # (K, ..., M, 1)
    right = _lead_k(b, len(batch))[..., None, :]  # (K, ..., 1, N)
    width = math.prod(out_shape)
    if width >= LARGE:
        return _matmul_in_place(left, right, out_shape)
    chunk = max(1, CHUNK // max(width, 1))
    acc = None
    for start in range(0, k, chunk):
        acc = _fold_terms(acc, np.multiply(left[start : start + chunk], right[start : start + chunk]))
    return acc


def _matmul_in_place(left, right, out_shape) -> np.ndarray:
    """The same fold for large outputs, one product at a time, on blocks of output rows small
    enough to stay in cache; ranges of rows go to threads (parallel.py)."""
    acc = np.empty(out_shape, left.dtype)
    row_size = acc.size // out_shape[-2]
    block = max(1, CACHE_BLOCK // row_size)

    def rows(start, stop):
        for low in range(start, stop, block):
            high = min(stop, low + block)
            out, part = acc[..., low:high, :], left[..., low:high, :]
            term = np.empty(out.shape, left.dtype)
            np.multiply(part[0], right[0], out=out)
            for index in range(1, part.shape[0]):
                np.multiply(part[index], right[index], out=term)
                np.add(out, term, out=out)

    run_ranges(rows, out_shape[-2], acc.size * left.shape[0])
    return acc


def _lead_k(x: np.ndarray, batch_rank: int) -> np.ndarray:
    """x (..., K, C) as a contiguous (K, 1.., ..., C) with `batch_rank` leading dims after K."""
    padded = x.reshape((1,) * (batch_rank - (x.ndim - 2)) + x.shape)
    rank = padded.ndim
    return np.ascontiguousarray(padded.transpose((rank - 2,) + tuple(range(rank - 2)) + (rank - 1,)))


def _fold_terms(acc, terms: np.ndarray) -> np.ndarray:
    """acc + terms[0] + terms[1] + ..., folded left to right (acc None: start at terms[0])."""
    if terms[0].size < WIDE:
        if acc is not None:
            np.add(acc, terms[0], out=terms[0])  # acc + p == p + acc exactly
        return np.add.accumulate(terms, axis=0, dtype=terms.dtype)[-1]
    rest = terms
    if acc is None:
        acc, rest = terms[0].copy(), terms[1:]
    for term in rest:
        np.add(acc, term, out=acc)
    return acc
