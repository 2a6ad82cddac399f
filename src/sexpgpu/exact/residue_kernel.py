"""The residue stage's three kernels on the device (residue_stage.py): an operand's residues,
their products, and the reconstruction of each output with its settling.

`_residues` reads each row twice: once for the bound of its norm, which fixes the row's
scale, then again to write the scaled row's rounded integer modulo each modulus (int8, one
plane a modulus), and the norm of what the rounding cut off. `_residue_products` multiplies
each modulus's planes on the int8 tensor cores (int32 sums, exact) and writes the product
modulo that modulus as an int8. `_reconstruct` reads an output's products modulo each
modulus, rebuilds the integer by the Chinese remainder theorem in words of 32 bits, scales
it and settles it (settle_kernel.settled_float32).

All arithmetic is float64 on integers that it holds exactly, except the few operations the
bounds allow for, so the compiled kernels and Triton's interpreter give the same bits.
Rounding to an integer adds and subtracts MAGIC (exact for magnitudes below 2**51), with
contraction off.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .queued_kernels import _two_sum_step
from .settle_kernel import settled_float32

_ADD = tl.standard._sum_combine  # inlined by the compiler and the interpreter alike (widen_kernel.py)
MAGIC = tl.constexpr(6755399441055744.0)  # 1.5 * 2**52: x + MAGIC - MAGIC is x rounded to an integer, ties to even
WORD = tl.constexpr(4294967296.0)  # 2**32 (constexpr: a kernel reads no other globals; both are float32s too)


@triton.jit
def _power_of_two(exponent):
    """2**exponent as float64, for int64 exponents inside float64's normal range."""
    return ((exponent + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _int8_residue(integer, modulus, inverse):
    """An integer-valued float64 below 2**51 modulo `modulus` (at most 256), in [-128, 127]."""
    residue = integer - ((integer * inverse + MAGIC) - MAGIC) * modulus  # off by at most one modulus
    residue = tl.where(residue > 127.0, residue - modulus, residue)
    return tl.where(residue < -128.0, residue + modulus, residue)


@triton.jit(do_not_specialize=["R", "RP"])
def _residues(x_ptr, out_ptr, norm_ptr, residual_ptr, unscale_ptr, table_ptr, R, RP, K, KP, stride_r, stride_k,
              top, raise_factor, COUNT: tl.constexpr, COLUMNS: tl.constexpr, BLOCK_R: tl.constexpr,
              BLOCK_K: tl.constexpr):
    # rows RP and columns KP are the padded planes' extent: padding is written as zeros
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    inside_rows = rows < R
    starts = rows.to(tl.int64) * stride_r
    squares = tl.full([BLOCK_R, BLOCK_K], 0.0, tl.float64)
    k0 = 0
    while k0 < K:  # while, not range: Triton's interpreter takes no tensor bounds in a range
        k = k0 + tl.arange(0, BLOCK_K)
        mask = inside_rows[:, None] & (k < K)[None, :]
        value = tl.load(x_ptr + starts[:, None] + k[None, :] * stride_k, mask=mask, other=0.0).to(tl.float64)
        squares += value * value  # exact: at most 48 significant bits
        k0 += BLOCK_K
    norm = tl.sqrt(tl.reduce(squares, 1, _ADD) * raise_factor) * raise_factor
    # 2**(e) > norm from its exponent bits; the scaled row's norm stays below 2**(top - 1)
    e = ((norm.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1022
    shift = tl.where(norm == 0, 0, top - 1 - e)
    scale = _power_of_two(shift)
    cut = tl.full([BLOCK_R, BLOCK_K], 0.0, tl.float64)
    plane = RP.to(tl.int64) * KP
    k0 = 0
    while k0 < KP:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = inside_rows[:, None] & (k < K)[None, :]
        value = tl.load(x_ptr + starts[:, None] + k[None, :] * stride_k, mask=mask, other=0.0).to(tl.float64)
        scaled = value * scale[:, None]  # exact: a power of two
        integer = (scaled + MAGIC) - MAGIC
        left = scaled - integer  # exact, at most 1/2
        cut += left * left
        at = rows.to(tl.int64)[:, None] * KP + k[None, :]
        inside_plane = (rows < RP)[:, None] & (k < KP)[None, :]
        for i in tl.static_range(COUNT):
            modulus = tl.load(table_ptr + i * COLUMNS)
            inverse = tl.load(table_ptr + i * COLUMNS + 1)
            tl.store(out_ptr + i * plane + at, _int8_residue(integer, modulus, inverse).to(tl.int8), mask=inside_plane)
        k0 += BLOCK_K
    residual = tl.sqrt(tl.reduce(cut, 1, _ADD) * raise_factor) * raise_factor
    unscale = _power_of_two(-shift)
    tl.store(norm_ptr + rows, norm, mask=inside_rows)
    tl.store(residual_ptr + rows, residual * unscale, mask=inside_rows)
    tl.store(unscale_ptr + rows, unscale, mask=inside_rows)


@triton.jit(do_not_specialize=["ROWS_PLANE"])
def _residue_products(x_ptr, w_ptr, out_ptr, table_ptr, ROWS_PLANE, X_PLANE, W_PLANE, NP, KP: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      COLUMNS: tl.constexpr):
    # program (tile, i): one output tile of modulus i's planes; the planes' extents are
    # multiples of the blocks (padded with zeros), so no load is masked. Tiles are taken in
    # groups of GROUP_M row tiles, so that a group's operands stay in L2.
    i = tl.program_id(1)
    tiles_m, tiles_n = ROWS_PLANE // BLOCK_M, NP // BLOCK_N
    in_group = GROUP_M * tiles_n
    first_m = (tl.program_id(0) // in_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (tl.program_id(0) % in_group) % group_rows
    tile_n = (tl.program_id(0) % in_group) // group_rows
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    x = x_ptr + i.to(tl.int64) * X_PLANE + rows.to(tl.int64)[:, None] * KP + k[None, :]
    w = w_ptr + i.to(tl.int64) * W_PLANE + cols.to(tl.int64)[None, :] * KP + k[:, None]
    sums = tl.full([BLOCK_M, BLOCK_N], 0, tl.int32)
    # a for loop over a constexpr extent: Triton pipelines it (a while loop ran 50 times slower),
    # and its interpreter takes no run-time bound in a range
    for _ in range(0, KP, BLOCK_K):
        sums = tl.dot(tl.load(x), tl.load(w), sums, out_dtype=tl.int32)
        x += BLOCK_K
        w += BLOCK_K
    modulus = tl.load(table_ptr + i * COLUMNS)
    inverse = tl.load(table_ptr + i * COLUMNS + 1)
    residue = _int8_residue(sums.to(tl.float64), modulus, inverse)
    out = out_ptr + i.to(tl.int64) * ROWS_PLANE * NP + rows.to(tl.int64)[:, None] * NP + cols[None, :]
    tl.store(out, residue.to(tl.int8))


@triton.jit
def _carry(low, high):
    """(low, high) with low moved into [0, 2**32) and its carry added to high: exact."""
    carry = tl.floor(low * (1.0 / WORD))
    return low - carry * WORD, high + carry


@triton.jit(do_not_specialize=["M", "ROWS_PLANE"])
def _reconstruct(planes_ptr, x_unscale_ptr, x_norm_ptr, x_residual_ptr, w_unscale_ptr, w_norm_ptr, w_residual_ptr,
                 table_ptr, words_ptr, value_ptr, done_ptr, M, N, ROWS_PLANE, NP, slack,
                 COUNT: tl.constexpr, COLUMNS: tl.constexpr, WORDS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside_rows, inside_cols = rows < M, cols < N
    mask = inside_rows[:, None] & inside_cols[None, :]
    at = rows.to(tl.int64)[:, None] * NP + cols[None, :]
    plane = ROWS_PLANE.to(tl.int64) * NP
    estimate = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float64)  # sum y_i c_i / P: the quotient's estimate
    w0 = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float64)
    w1 = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float64)
    w2 = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float64)
    w3 = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float64)
    for i in tl.static_range(COUNT):
        y = tl.load(planes_ptr + i * plane + at, mask=mask, other=0).to(tl.float64)  # a residue: |y| <= 128
        estimate += y * tl.load(table_ptr + i * COLUMNS + 2)
        w0 += y * tl.load(table_ptr + i * COLUMNS + 3)
        w1 += y * tl.load(table_ptr + i * COLUMNS + 4)
        w2 += y * tl.load(table_ptr + i * COLUMNS + 5)
        if WORDS > 3:
            w3 += y * tl.load(table_ptr + i * COLUMNS + 6)
    quotient = (estimate + MAGIC) - MAGIC
    w0 -= quotient * tl.load(words_ptr)
    w1 -= quotient * tl.load(words_ptr + 1)
    w2 -= quotient * tl.load(words_ptr + 2)
    if WORDS > 3:
        w3 -= quotient * tl.load(words_ptr + 3)
    # normalise, take the sign from the top word, make every word non-negative, normalise again;
    # then the words are summed from the top by TwoSum, whose errors bound the sum's own
    w0, w1 = _carry(w0, w1)
    w1, w2 = _carry(w1, w2)
    if WORDS > 3:
        w2, w3 = _carry(w2, w3)
        sign = tl.where(w3 < 0, -1.0, 1.0)
    else:
        sign = tl.where(w2 < 0, -1.0, 1.0)
    w0, w1 = _carry(w0 * sign, w1 * sign)
    w1, w2 = _carry(w1, w2 * sign)
    magnitude = w2 * (WORD * WORD)  # exact: a power of two times an integer of at most 53 bits
    errors = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float64)  # the errors' sum: not needed here
    rounding = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float64)  # the sum of their magnitudes
    if WORDS > 3:
        w2, w3 = _carry(w2, w3 * sign)
        magnitude, errors, rounding = _two_sum_step(w3 * (WORD * WORD * WORD), errors, rounding, w2 * (WORD * WORD))
    magnitude, errors, rounding = _two_sum_step(magnitude, errors, rounding, w1 * WORD)
    magnitude, errors, rounding = _two_sum_step(magnitude, errors, rounding, w0)
    x_unscale = tl.load(x_unscale_ptr + rows, mask=inside_rows, other=1.0)
    w_unscale = tl.load(w_unscale_ptr + cols, mask=inside_cols, other=1.0)
    x_norm = tl.load(x_norm_ptr + rows, mask=inside_rows, other=0.0)
    x_residual = tl.load(x_residual_ptr + rows, mask=inside_rows, other=0.0)
    w_norm = tl.load(w_norm_ptr + cols, mask=inside_cols, other=0.0)
    w_residual = tl.load(w_residual_ptr + cols, mask=inside_cols, other=0.0)
    scale = x_unscale[:, None] * w_unscale[None, :]  # exact: powers of two
    total = (sign * magnitude) * scale
    cut = x_residual[:, None] * w_norm[None, :] + (x_norm + x_residual)[:, None] * w_residual[None, :]
    bound = (rounding * scale + cut) * slack  # rounding is 0 where the sum is exact: exact ties settle
    done, value = settled_float32(total, bound)
    out = rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(value_ptr + out, value, mask=mask)
    tl.store(done_ptr + out, done.to(tl.int8), mask=mask)
