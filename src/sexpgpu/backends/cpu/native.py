"""The interpreter's compiled kernels: numba, without fast-math, in the orders folds.py documents.

numba compiles these loops through LLVM with its default floating-point semantics: every
multiply and add is its own IEEE operation, rounded in the array's dtype; nothing is
reassociated or contracted into a fused multiply-add (fast-math is off, and LLVM fuses only
when told it may). LLVM vectorises the innermost loop across output elements, whose
operations are independent, so the vector width (SSE, AVX2, AVX-512) changes the speed on
a machine, never a bit. tests/backends/test_cpu_fast_paths.py checks the bits against numpy's
operations, one rounded step at a time, including signed zeros, subnormals, infinities and
NaN.

Compiled once per machine and cached next to this file (cache=True); each kernel has one
specialisation per float dtype (float32 for runs, float64 for the test oracle). Every kernel
releases the GIL, so parallel.py's threads run them side by side.
"""

from __future__ import annotations

import numba
import numpy as np

ROW_GROUP = 4  # output rows folded together: each k reads a row of b once for all four
# every kernel: no fast-math (numba's default, said here so that no one adds it), IEEE
# results for a division by zero as numpy gives them (not Python's exception), the GIL released
OPTIONS = {"fastmath": False, "error_model": "numpy", "nogil": True}
# (helpers come first: a kernel with signatures is compiled, or loaded from the cache, at import)


@numba.njit(cache=True, inline="always", **OPTIONS)
def _fold_one_row(a_row, b, out_row, depth, width):  # pragma: no cover - compiled
    k = 2 if depth >= 2 else 1  # two k's per pass over the row (_fold_four_rows says why)
    if k == 2:
        x, z = a_row[0], a_row[1]
        b_k, b_next = b[0], b[1]
        for j in range(width):
            out_row[j] = x * b_k[j] + z * b_next[j]
    else:
        x = a_row[0]
        for j in range(width):
            out_row[j] = x * b[0, j]
    while k + 2 <= depth:
        x, z = a_row[k], a_row[k + 1]
        b_k, b_next = b[k], b[k + 1]
        for j in range(width):
            out_row[j] = (out_row[j] + x * b_k[j]) + z * b_next[j]
        k += 2
    if k < depth:
        x = a_row[k]
        for j in range(width):
            out_row[j] = out_row[j] + x * b[k, j]
    _quiet_nans(out_row, width)


@numba.njit(cache=True, inline="always", **OPTIONS)
def _quiet_nans(out_row, width):  # pragma: no cover - compiled
    for j in range(width):
        if out_row[j] != out_row[j]:
            out_row[j] = np.nan


@numba.njit(cache=True, inline="always", **OPTIONS)
def _fold_four_rows(a, b, out, i, depth, width):  # pragma: no cover - compiled
    o0, o1, o2, o3 = out[i], out[i + 1], out[i + 2], out[i + 3]
    a0, a1, a2, a3 = a[i], a[i + 1], a[i + 2], a[i + 3]
    # two k's per pass over the rows: each output is loaded and stored once for two of its
    # additions (the loads and stores of the running sums bound this loop), which stay two
    # additions in the fold's order, each rounded. The first pass stores p0 + p1, the first
    # sum of the fold (acc = p0, then acc + p1: the same rounding)
    k = 2 if depth >= 2 else 1
    if k == 2:
        x0, x1, x2, x3 = a0[0], a1[0], a2[0], a3[0]
        z0, z1, z2, z3 = a0[1], a1[1], a2[1], a3[1]
        b_k, b_next = b[0], b[1]
        for j in range(width):
            y, w = b_k[j], b_next[j]
            o0[j] = x0 * y + z0 * w
            o1[j] = x1 * y + z1 * w
            o2[j] = x2 * y + z2 * w
            o3[j] = x3 * y + z3 * w
    else:
        x0, x1, x2, x3 = a0[0], a1[0], a2[0], a3[0]
        for j in range(width):
            y = b[0, j]
            o0[j] = x0 * y
            o1[j] = x1 * y
            o2[j] = x2 * y
            o3[j] = x3 * y
    while k + 2 <= depth:
        x0, x1, x2, x3 = a0[k], a1[k], a2[k], a3[k]
        z0, z1, z2, z3 = a0[k + 1], a1[k + 1], a2[k + 1], a3[k + 1]
        b_k, b_next = b[k], b[k + 1]
        for j in range(width):
            y, w = b_k[j], b_next[j]
            o0[j] = (o0[j] + x0 * y) + z0 * w
            o1[j] = (o1[j] + x1 * y) + z1 * w
            o2[j] = (o2[j] + x2 * y) + z2 * w
            o3[j] = (o3[j] + x3 * y) + z3 * w
        k += 2
    if k < depth:
        x0, x1, x2, x3 = a0[k], a1[k], a2[k], a3[k]
        for j in range(width):
            y = b[k, j]
            o0[j] = o0[j] + x0 * y
            o1[j] = o1[j] + x1 * y
            o2[j] = o2[j] + x2 * y
            o3[j] = o3[j] + x3 * y
    for row in (o0, o1, o2, o3):
        _quiet_nans(row, width)


def _product_signature(dtype):
    """a may be strided (a transposed operand is read in place), b and out are C-contiguous."""
    scalar = numba.from_dtype(np.dtype(dtype))
    array = numba.types.Array
    return numba.types.void(array(scalar, 3, "A", readonly=True), array(scalar, 3, "C", readonly=True),
                            array(scalar, 3, "C"), numba.types.intp, numba.types.intp)


@numba.njit([_product_signature(np.float32), _product_signature(np.float64)], cache=True, **OPTIONS)
def fold_products(a, b, out, first, stop):  # pragma: no cover - compiled; the tests call it through folds.matmul
    """out[p, i, :] = fold over k of a[p, i, k] * b[p, k, :] for the flattened rows
    first <= p * M + i < stop. a (Pa, M, K) may have any strides, b (Pb, K, N) and out
    (P, M, N) are C-contiguous, and Pa, Pb are P or 1 (broadcast). Each output element is acc = a0 * b0, then
    acc = acc + ak * bk for k = 1 .. K-1, vectorised across the row's N outputs. A NaN
    output is the quiet NaN of positive sign and no payload (0x7FC00000 in float32), as
    sexpgpu.numerics answers: the sign and payload the hardware gives depend on which
    operand LLVM puts first, which it may choose differently for another instruction set."""
    rows, depth, width = out.shape[1], a.shape[2], out.shape[2]
    row = first
    while row < stop:
        batch = row // rows
        i = row - batch * rows
        left = a[batch if a.shape[0] > 1 else 0]
        right = b[batch if b.shape[0] > 1 else 0]
        if i + ROW_GROUP <= rows and row + ROW_GROUP <= stop:
            _fold_four_rows(left, right, out[batch], i, depth, width)
            row += ROW_GROUP
        else:
            _fold_one_row(left[i], right, out[batch, i], depth, width)
            row += 1


@numba.njit(cache=True, **OPTIONS)
def fold_last_axis(x, out, first, stop):  # pragma: no cover - compiled; the tests call it through folds.reduce_sum
    """out[r] = x[r, 0] + x[r, 1] + ... + x[r, W-1], folded left to right, for rows first <= r
    < stop of a C-contiguous (R, W) x, W >= 1. Four rows' folds run side by side (independent
    chains of additions, which the processor overlaps); a NaN sum is the quiet NaN, as above."""
    width = x.shape[1]
    row = first
    while row + ROW_GROUP <= stop:
        acc0, acc1, acc2, acc3 = x[row, 0], x[row + 1, 0], x[row + 2, 0], x[row + 3, 0]
        for j in range(1, width):
            acc0 = acc0 + x[row, j]
            acc1 = acc1 + x[row + 1, j]
            acc2 = acc2 + x[row + 2, j]
            acc3 = acc3 + x[row + 3, j]
        out[row], out[row + 1], out[row + 2], out[row + 3] = acc0, acc1, acc2, acc3
        row += ROW_GROUP
    for rest in range(row, stop):
        acc = x[rest, 0]
        for j in range(1, width):
            acc = acc + x[rest, j]
        out[rest] = acc
    _quiet_nans(out[first:stop], stop - first)


@numba.njit(cache=True, **OPTIONS)
def mixed_sum(words, mix_1, mix_2):  # pragma: no cover - compiled; test_fingerprint.py checks it against the formula
    """fingerprint.py's sum modulo 2^64 of mix((i << 32) | w_i) over uint32 words; unsigned
    64-bit arithmetic wraps."""
    total = np.uint64(0)
    for index in range(words.size):
        z = (np.uint64(index) << np.uint64(32)) | np.uint64(words[index])
        z ^= z >> np.uint64(30)
        z *= mix_1
        z ^= z >> np.uint64(27)
        z *= mix_2
        z ^= z >> np.uint64(31)
        total += z
    return total
