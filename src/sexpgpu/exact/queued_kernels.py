"""The Triton kernels of the queued path (queued.py): every decision on the device, no host wait.

- `_row_sums`, `_segment_sums`: det_sum's first stage: each row's float64 sum and the float64
  sum of its magnitudes, in BLOCK_K lanes that each add their columns in turn, then the lanes
  (in any order), then (long rows) the segments in order; settled by the magnitude bound;
- `_list_pending`: the outputs still pending, listed on the device (each block's outputs at
  places taken by an atomic count), with the count left in device memory;
- `_pair_refine`: for each listed output, its products summed by TwoSum in BLOCK_K lanes, the
  lanes joined by a reduction whose combiner is TwoSum (pair_sums.py's inequality (2)), settled; an output with a NaN
  or infinite product takes the special rule instead (docs/exact.md, "Special values");
- `_exact_refine`: for each output the pair sums left (their second list), the Kulisch digits of
  its products (the peeling of triton_kernel.py) in lanes along K, added over the lanes as
  integers, carried, and rounded once to float32 in the kernel;
- `_normalise_planes`, `_round_planes`: an accumulator's planes carried in place, and rounded
  once to float32, one launch each (accumulator.normalise_ and rounding.round_planes on CUDA);
- `_scatter_sums`: the sums of rows picked by ids (scatter.py), each from the Kulisch digits of
  its own rows in their sorted order, as digits or rounded.

The two refine kernels are persistent: a fixed grid whose programs walk the list, which holds
as many outputs as the device says, so the host never reads the count. Every factor is a
float32 rounded up (float64_stage.upward_float32): a compiled kernel reads a Python float as
float32, the interpreter as float64. Contraction is off in every launch (TwoSum and the
bounds need each operation rounded on its own).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .settle_kernel import settled_float32
from .triton_kernel import _fp64_from_bits, _peel_product

# Triton's own tl.sum and tl.zeros are @triton.jit functions, compiled or interpreted as Triton
# was first imported, so they are not called here: zeros are tl.full, and sums are tl.reduce
# and tl.associative_scan with Triton's own adding combiner, which a compiled kernel inlines
# like any, and which Triton's interpreter recognises and runs as one numpy sum instead of a
# Python call per element (it is never called there). The float64 sums' order is Triton's;
# their bounds hold for any order.
_ADD = tl.standard._sum_combine


# --- det_sum's first stage --------------------------------------------------------------------


@triton.jit
def _settle_sums(total, magnitude, bound_factor, magnitude_factor, at, inside, result_ptr, done_ptr, magnitude_ptr):
    done, value = settled_float32(total, magnitude * bound_factor)
    tl.store(result_ptr + at, value, mask=inside)
    tl.store(done_ptr + at, done.to(tl.int8), mask=inside)
    tl.store(magnitude_ptr + at, magnitude * magnitude_factor, mask=inside)


@triton.jit(do_not_specialize=["R", "K", "SEGMENT"])
def _row_sums(x_ptr, sums_ptr, magnitudes_ptr, result_ptr, done_ptr, magnitude_ptr, R, K, stride_r, stride_k,
              SEGMENT, bound_factor, magnitude_factor,
              SETTLE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    # program (i, s): rows i*BLOCK_R.., columns of segment s; SETTLE: one segment, settled here
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    segment = tl.program_id(1)
    inside_rows = rows < R
    start = segment.to(tl.int64) * SEGMENT
    end = tl.minimum(start + SEGMENT, K)
    total = tl.full([BLOCK_R, BLOCK_K], 0.0, tl.float64)
    magnitude = tl.full([BLOCK_R, BLOCK_K], 0.0, tl.float64)
    k0 = start
    while k0 < end:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = inside_rows[:, None] & (k < end)[None, :]
        value = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_r + k[None, :] * stride_k,
                        mask=mask, other=0.0).to(tl.float64)
        total += value
        magnitude += tl.abs(value)
        k0 += BLOCK_K
    # the lanes joined in Triton's order, counted as BLOCK_K - 1 additions. An explicit pairwise
    # tree (log2 BLOCK_K) compiled to layout conversions that repeated the trees across threads:
    # 1056 float64 additions a thread for 4 rows of 512, against 74 here
    row_total = tl.reduce(total, 1, _ADD)
    row_magnitude = tl.reduce(magnitude, 1, _ADD)
    if SETTLE:
        _settle_sums(row_total, row_magnitude, bound_factor, magnitude_factor, rows, inside_rows,
                     result_ptr, done_ptr, magnitude_ptr)
    else:
        segments = tl.num_programs(1)
        at = rows.to(tl.int64) * segments + segment
        tl.store(sums_ptr + at, row_total, mask=inside_rows)
        tl.store(magnitudes_ptr + at, row_magnitude, mask=inside_rows)


@triton.jit(do_not_specialize=["R", "SEGMENTS"])
def _segment_sums(sums_ptr, magnitudes_ptr, result_ptr, done_ptr, magnitude_ptr, R, SEGMENTS,
                  bound_factor, magnitude_factor, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    inside_rows = rows < R
    total = tl.full([BLOCK_R], 0.0, tl.float64)
    magnitude = tl.full([BLOCK_R], 0.0, tl.float64)
    segment = 0
    while segment < SEGMENTS:  # in order: each partial passes through at most SEGMENTS additions
        at = rows.to(tl.int64) * SEGMENTS + segment
        total += tl.load(sums_ptr + at, mask=inside_rows, other=0.0)
        magnitude += tl.load(magnitudes_ptr + at, mask=inside_rows, other=0.0)
        segment += 1
    _settle_sums(total, magnitude, bound_factor, magnitude_factor, rows, inside_rows,
                 result_ptr, done_ptr, magnitude_ptr)


# --- the pending outputs, listed on the device -----------------------------------------------


@triton.jit(do_not_specialize=["TOTAL"])
def _list_pending(done_ptr, count_ptr, listed_ptr, TOTAL, BLOCK: tl.constexpr):
    # each block's pending outputs at places taken by an atomic count, in one pass: the list's
    # order is the atomics', which no bit depends on (each output is its own sum); a count, a
    # scan of the counts and a second pass took four launches, a tenth of the queued path's
    # kernels in an exact gpt-50m step
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    pending = (tl.load(done_ptr + at, mask=at < TOTAL, other=1) == 0).to(tl.int32)  # a block's count fits
    count = tl.reduce(pending, 0, _ADD)
    if count > 0:  # most blocks, where the bound settles most outputs, take no place
        start = tl.atomic_add(count_ptr, count.to(tl.int64))
        place = tl.associative_scan(pending, 0, _ADD)  # 1 + how many pending outputs precede, in the block
        tl.store(listed_ptr + start + place - 1, at, mask=pending == 1)


# --- refining the listed outputs ---------------------------------------------------------------


@triton.jit
def _listed_rows(listed_ptr, slots, listed, M, N, ONES: tl.constexpr):
    """(output index, row of x, row of w) of list slots: output b*M*N + m*N + n reads row b*M + m
    of x and row b*N + n of w (row 0, the ones, for a sum)."""
    out = tl.load(listed_ptr + slots, mask=listed, other=0).to(tl.int64)
    outputs = M.to(tl.int64) * N
    matrix = out // outputs
    rest = out - matrix * outputs
    m = rest // N
    n = rest - m * N
    if ONES:
        w_row = n * 0
    else:
        w_row = matrix * N + n
    return out, matrix * M + m, w_row


@triton.jit
def _two_sum_combine(a, error_a, rounded_a, b, error_b, rounded_b):
    """Two lanes (sum, errors, sum of |errors|) joined by TwoSum, a reduction's combiner: the
    sums' error collected, and its magnitude (zero exactly when no addition rounded)."""
    joined = a + b
    b_part = joined - a
    error = (a - (joined - b_part)) + (b - b_part)
    return joined, (error_a + error_b) + error, (rounded_a + rounded_b) + tl.abs(error)


@triton.jit
def _two_sum_step(total, errors, rounded, product):
    """One TwoSum of each lane's product into its sum: its error into errors, |error| into rounded."""
    new_total = total + product
    product_part = new_total - total
    error = (total - (new_total - product_part)) + (product - product_part)
    return new_total, errors + error, rounded + tl.abs(error)


@triton.jit
def _lane_product(x_ptr, w_ptr, x_row, w_row, k, inside, stride_xr, stride_xk, stride_wr, stride_wk,
                  ONES: tl.constexpr):
    """Each lane's product at columns k, in float64: exact, or NaN, or an infinity of the factors' sign."""
    a = tl.load(x_ptr + x_row[:, None] * stride_xr + k[None, :].to(tl.int64) * stride_xk,
                mask=inside, other=0.0).to(tl.float64)
    if ONES:
        return a
    b = tl.load(w_ptr + w_row[:, None] * stride_wr + k[None, :].to(tl.int64) * stride_wk,
                mask=inside, other=0.0).to(tl.float64)
    return a * b


@triton.jit
def _lanes(x_ptr, w_ptr, x_row, w_row, listed, K, stride_xr, stride_xk, stride_wr, stride_wk,
           ONES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, SPECIAL: tl.constexpr):
    """(sums, errors, rounded) of each lane, and per output how many products are NaN, +inf and
    -inf. SPECIAL: products may be NaN or infinite, and are then counted and summed as 0;
    else every product is finite and the counts are 0."""
    lanes = tl.arange(0, BLOCK_K)
    total = tl.full([BLOCK_P, BLOCK_K], 0.0, tl.float64)
    errors = tl.full([BLOCK_P, BLOCK_K], 0.0, tl.float64)
    rounded = tl.full([BLOCK_P, BLOCK_K], 0.0, tl.float64)
    nan = tl.full([BLOCK_P, BLOCK_K], 0, tl.int32)  # counts: at most K of each
    up = tl.full([BLOCK_P, BLOCK_K], 0, tl.int32)
    down = tl.full([BLOCK_P, BLOCK_K], 0, tl.int32)
    k0 = 0
    while k0 < K:
        k = k0 + lanes
        product = _lane_product(x_ptr, w_ptr, x_row, w_row, k, listed[:, None] & (k < K)[None, :],
                                stride_xr, stride_xk, stride_wr, stride_wk, ONES)
        if SPECIAL:
            nan += (product != product).to(tl.int32)
            up += (product == float("inf")).to(tl.int32)
            down += (product == float("-inf")).to(tl.int32)
            product = tl.where((product - product) == 0, product, 0.0)
        total, errors, rounded = _two_sum_step(total, errors, rounded, product)
        k0 += BLOCK_K
    if SPECIAL:
        return total, errors, rounded, tl.reduce(nan, 1, _ADD), tl.reduce(up, 1, _ADD), tl.reduce(down, 1, _ADD)
    none = tl.full([BLOCK_P], 0, tl.int32)
    return total, errors, rounded, none, none, none


@triton.jit(do_not_specialize=["M", "N", "K"])
def _pair_refine(x_ptr, w_ptr, x_norm_ptr, w_norm_ptr, listed_ptr, count_ptr, result_ptr, done_ptr, left_ptr,
                 left_count_ptr, M, N, K, stride_xr, stride_xk, stride_wr, stride_wk, unit_factor, terms_factor,
                 ONES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
    count = tl.load(count_ptr)
    first = tl.program_id(0).to(tl.int64) * BLOCK_P
    while first < count:
        slots = first + tl.arange(0, BLOCK_P)
        listed = slots < count
        out, x_row, w_row = _listed_rows(listed_ptr, slots, listed, M, N, ONES)
        magnitude = tl.load(x_norm_ptr + x_row, mask=listed, other=0.0) * tl.load(w_norm_ptr + w_row, mask=listed,
                                                                                  other=0.0)
        # a row holding a non-finite element has an infinite or NaN norm: only then are
        # products classified, which costs a third of the loop's time
        if tl.reduce(((magnitude - magnitude) != 0).to(tl.int32), 0, _ADD) == 0:
            total, errors, rounded, nan, up, down = _lanes(x_ptr, w_ptr, x_row, w_row, listed, K, stride_xr,
                                                           stride_xk, stride_wr, stride_wk, ONES, BLOCK_P, BLOCK_K,
                                                           False)
        else:
            total, errors, rounded, nan, up, down = _lanes(x_ptr, w_ptr, x_row, w_row, listed, K, stride_xr,
                                                           stride_xk, stride_wr, stride_wk, ONES, BLOCK_P, BLOCK_K,
                                                           True)
        # the lanes joined by TwoSums in a tree of Triton's choosing: bound (2) holds for any
        # grouping, counting up to BLOCK_K - 1 joins on an error's path (queued._refine's terms)
        hi, lo, rounded = tl.reduce((total, errors, rounded), 1, _two_sum_combine)
        refined = hi + lo
        bound = tl.abs(refined) * unit_factor + magnitude * terms_factor
        # no addition rounded: every error is 0, so hi is the exact sum and the bound is 0
        # (settled_float32 then takes the one rounding of hi, ties to even included)
        bound = tl.where(rounded == 0, 0.0, bound)
        done, value = settled_float32(refined, bound)
        nan_out = (nan > 0) | ((up > 0) & (down > 0))
        special = (nan > 0) | (up > 0) | (down > 0)
        value = tl.where(down > 0, float("-inf"), value)
        value = tl.where(up > 0, float("inf"), value)
        value = tl.where(nan_out, float("nan"), value)
        finished = listed & (done | special)
        tl.store(result_ptr + out, value, mask=finished)
        tl.store(done_ptr + out, tl.full([BLOCK_P], 1, tl.int8), mask=finished)
        # what is left goes on a second list, for the exact stage alone to walk; its order is
        # the atomics', which no bit depends on (each output is its own exact sum)
        left = (listed & ~finished).to(tl.int32)
        count_left = tl.reduce(left, 0, _ADD)
        if count_left > 0:
            start = tl.atomic_add(left_count_ptr, count_left.to(tl.int64))
            place = tl.associative_scan(left, 0, _ADD) - 1
            tl.store(left_ptr + start + place, out, mask=left == 1)
        first += tl.num_programs(0) * BLOCK_P


@triton.jit
def _carry(low, high):
    """low kept in [0, 2**32), its carry (an arithmetic shift: a floor) added into high."""
    carry = low >> 32
    return low - (carry << 32), high + carry


@triton.jit
def _normalised(d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17):
    d0, d1 = _carry(d0, d1)
    d1, d2 = _carry(d1, d2)
    d2, d3 = _carry(d2, d3)
    d3, d4 = _carry(d3, d4)
    d4, d5 = _carry(d4, d5)
    d5, d6 = _carry(d5, d6)
    d6, d7 = _carry(d6, d7)
    d7, d8 = _carry(d7, d8)
    d8, d9 = _carry(d8, d9)
    d9, d10 = _carry(d9, d10)
    d10, d11 = _carry(d10, d11)
    d11, d12 = _carry(d11, d12)
    d12, d13 = _carry(d12, d13)
    d13, d14 = _carry(d13, d14)
    d14, d15 = _carry(d14, d15)
    d15, d16 = _carry(d15, d16)
    d16, d17 = _carry(d16, d17)
    return d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17


@triton.jit
def _pick(index, i: tl.constexpr, digit, chosen):
    return tl.where(index == i, digit, chosen)


@triton.jit
def _digit_at(index, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17):
    """digits[index], per output (0 outside 0..17)."""
    chosen = d0 * 0
    chosen = _pick(index, 0, d0, chosen)
    chosen = _pick(index, 1, d1, chosen)
    chosen = _pick(index, 2, d2, chosen)
    chosen = _pick(index, 3, d3, chosen)
    chosen = _pick(index, 4, d4, chosen)
    chosen = _pick(index, 5, d5, chosen)
    chosen = _pick(index, 6, d6, chosen)
    chosen = _pick(index, 7, d7, chosen)
    chosen = _pick(index, 8, d8, chosen)
    chosen = _pick(index, 9, d9, chosen)
    chosen = _pick(index, 10, d10, chosen)
    chosen = _pick(index, 11, d11, chosen)
    chosen = _pick(index, 12, d12, chosen)
    chosen = _pick(index, 13, d13, chosen)
    chosen = _pick(index, 14, d14, chosen)
    chosen = _pick(index, 15, d15, chosen)
    chosen = _pick(index, 16, d16, chosen)
    chosen = _pick(index, 17, d17, chosen)
    return chosen


@triton.jit
def _highest(index, i: tl.constexpr, digit):
    return tl.where(digit != 0, i, index)


@triton.jit
def _below(index, i: tl.constexpr, digit, found):
    return found | ((index > i) & (digit != 0))


@triton.jit
def _rounded_float32(d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17):
    """The exact value of int64 digits (weights 2**(32 * (i - 10)), any magnitudes below 2**62)
    rounded once to float32, to nearest even: rounding.round_planes, step for step."""
    d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17 = _normalised(
        d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17)
    negative = d17 < 0
    d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17 = _normalised(
        tl.where(negative, -d0, d0), tl.where(negative, -d1, d1), tl.where(negative, -d2, d2),
        tl.where(negative, -d3, d3), tl.where(negative, -d4, d4), tl.where(negative, -d5, d5),
        tl.where(negative, -d6, d6), tl.where(negative, -d7, d7), tl.where(negative, -d8, d8),
        tl.where(negative, -d9, d9), tl.where(negative, -d10, d10), tl.where(negative, -d11, d11),
        tl.where(negative, -d12, d12), tl.where(negative, -d13, d13), tl.where(negative, -d14, d14),
        tl.where(negative, -d15, d15), tl.where(negative, -d16, d16), tl.where(negative, -d17, d17))
    top = d0 * 0 - 1  # the highest non-zero digit, -1 for zero
    top = _highest(top, 0, d0)
    top = _highest(top, 1, d1)
    top = _highest(top, 2, d2)
    top = _highest(top, 3, d3)
    top = _highest(top, 4, d4)
    top = _highest(top, 5, d5)
    top = _highest(top, 6, d6)
    top = _highest(top, 7, d7)
    top = _highest(top, 8, d8)
    top = _highest(top, 9, d9)
    top = _highest(top, 10, d10)
    top = _highest(top, 11, d11)
    top = _highest(top, 12, d12)
    top = _highest(top, 13, d13)
    top = _highest(top, 14, d14)
    top = _highest(top, 15, d15)
    top = _highest(top, 16, d16)
    top = _highest(top, 17, d17)
    top_digit = _digit_at(top, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17)
    # the bit length from the float64 exponent: exact below 2**53, and a top digit beyond that overflows anyway
    length = ((top_digit.to(tl.float64).to(tl.int64, bitcast=True) >> 52) & 2047) - 1022
    top_bit = tl.where(top < 0, -1, 32 * top + length - 1)  # counted from 2**-320
    lowest_kept = tl.maximum(top_bit - 23, 171)  # 24 bits, or down to 2**-149
    low = _digit_at(lowest_kept >> 5, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17)
    high = _digit_at((lowest_kept >> 5) + 1, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15,
                     d16, d17)
    kept = ((high << 32) + low) >> (lowest_kept & 31)
    below = lowest_kept - 1
    holding = _digit_at(below >> 5, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17)
    round_bit = (holding >> (below & 31)) & 1
    sticky = (holding & ((tl.full(below.shape, 1, tl.int64) << (below & 31)) - 1)) != 0
    index = below >> 5
    sticky = _below(index, 0, d0, sticky)
    sticky = _below(index, 1, d1, sticky)
    sticky = _below(index, 2, d2, sticky)
    sticky = _below(index, 3, d3, sticky)
    sticky = _below(index, 4, d4, sticky)
    sticky = _below(index, 5, d5, sticky)
    sticky = _below(index, 6, d6, sticky)
    sticky = _below(index, 7, d7, sticky)
    sticky = _below(index, 8, d8, sticky)
    sticky = _below(index, 9, d9, sticky)
    sticky = _below(index, 10, d10, sticky)
    sticky = _below(index, 11, d11, sticky)
    sticky = _below(index, 12, d12, sticky)
    sticky = _below(index, 13, d13, sticky)
    sticky = _below(index, 14, d14, sticky)
    sticky = _below(index, 15, d15, sticky)
    sticky = _below(index, 16, d16, sticky)
    sticky = _below(index, 17, d17, sticky)
    kept += round_bit & (sticky.to(tl.int64) | (kept & 1))
    scale = ((lowest_kept - 320 + 1023) << 52).to(tl.float64, bitcast=True)  # 2**(lowest kept bit), exact
    magnitude = (kept.to(tl.float64) * scale).to(tl.float32)  # exact, or infinite at 2**128
    magnitude = tl.where(top_bit >= 448, float("inf"), magnitude)  # 2**128 and above
    return tl.where(negative, magnitude * -1.0, magnitude)  # Triton's -x is 0 - x, which keeps a zero +0.0


@triton.jit
def _zeros(BLOCK: tl.constexpr, dtype: tl.constexpr):
    """18 digit registers of BLOCK outputs, zero."""
    z = tl.full([BLOCK], 0, dtype)
    return z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z


@triton.jit
def _flush(i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17,
           a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17):
    """Each int64 digit plus its float64 register's part."""
    return (_flushed(i0, a0, 0), _flushed(i1, a1, 1), _flushed(i2, a2, 2), _flushed(i3, a3, 3), _flushed(i4, a4, 4),
            _flushed(i5, a5, 5), _flushed(i6, a6, 6), _flushed(i7, a7, 7), _flushed(i8, a8, 8), _flushed(i9, a9, 9),
            _flushed(i10, a10, 10), _flushed(i11, a11, 11), _flushed(i12, a12, 12), _flushed(i13, a13, 13),
            _flushed(i14, a14, 14), _flushed(i15, a15, 15), _flushed(i16, a16, 16), _flushed(i17, a17, 17))


@triton.jit
def _flushed(total, part, digit: tl.constexpr):
    """An int64 digit plus a float64 register's part of it (an exact multiple of its weight)."""
    scale = _fp64_from_bits((1023 - 32 * (digit - 10)) << 52)  # 2**-(32 * (digit - 10))
    return total + (part * scale).to(tl.int64)


@triton.jit(do_not_specialize=["M", "N", "K"])
def _exact_refine(x_ptr, w_ptr, listed_ptr, count_ptr, result_ptr, M, N, K, stride_xr, stride_xk,
                  stride_wr, stride_wk, ONES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                  FLUSH: tl.constexpr):
    # each listed output (those the pair sums left) walks its K in BLOCK_K lanes, FLUSH columns
    # at a time into float64 digit registers of each lane (exact: at most 2**19 parts below
    # 2**32 units), which are then added over the lanes into int64 digits
    count = tl.load(count_ptr)
    first = tl.program_id(0).to(tl.int64) * BLOCK_P
    while first < count:
        slots = first + tl.arange(0, BLOCK_P)
        listed = slots < count
        out, x_row, w_row = _listed_rows(listed_ptr, slots, listed, M, N, ONES)
        _exact_outputs(x_ptr, w_ptr, result_ptr, out, x_row, w_row, listed, K, stride_xr, stride_xk, stride_wr,
                       stride_wk, ONES, BLOCK_P, BLOCK_K, FLUSH)
        first += tl.num_programs(0) * BLOCK_P


@triton.jit
def _lane_digits(a, digit: tl.constexpr):
    """A digit's float64 registers (BLOCK_P, BLOCK_K), exact multiples of its weight, as int64
    units of that weight summed over the lanes (integers: any order is exact)."""
    scale = _fp64_from_bits((1023 - 32 * (digit - 10)) << 52)  # 2**-(32 * (digit - 10))
    return tl.reduce((a * scale).to(tl.int64), 1, _ADD)


@triton.jit
def _flush_lanes(i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17,
                 a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17):
    """Each int64 digit plus its lanes' float64 registers."""
    return (i0 + _lane_digits(a0, 0), i1 + _lane_digits(a1, 1), i2 + _lane_digits(a2, 2),
            i3 + _lane_digits(a3, 3), i4 + _lane_digits(a4, 4), i5 + _lane_digits(a5, 5),
            i6 + _lane_digits(a6, 6), i7 + _lane_digits(a7, 7), i8 + _lane_digits(a8, 8),
            i9 + _lane_digits(a9, 9), i10 + _lane_digits(a10, 10), i11 + _lane_digits(a11, 11),
            i12 + _lane_digits(a12, 12), i13 + _lane_digits(a13, 13), i14 + _lane_digits(a14, 14),
            i15 + _lane_digits(a15, 15), i16 + _lane_digits(a16, 16), i17 + _lane_digits(a17, 17))


@triton.jit
def _lane_zeros(BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
    """18 float64 digit registers of BLOCK_P outputs in BLOCK_K lanes, zero."""
    z = tl.full([BLOCK_P, BLOCK_K], 0.0, tl.float64)
    return z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z


@triton.jit
def _exact_outputs(x_ptr, w_ptr, result_ptr, out, x_row, w_row, listed, K, stride_xr, stride_xk, stride_wr,
                   stride_wk, ONES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                   FLUSH: tl.constexpr):
    """The listed outputs' exact sums, rounded once to float32 and stored."""
    lanes = tl.arange(0, BLOCK_K)
    i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17 = _zeros(BLOCK_P, tl.int64)
    k0 = 0
    while k0 < K:
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17 = _lane_zeros(BLOCK_P, BLOCK_K)
        end = tl.minimum(k0 + FLUSH, K)
        k = k0
        while k < end:
            product = _lane_product(x_ptr, w_ptr, x_row, w_row, k + lanes,
                                    listed[:, None] & (k + lanes < end)[None, :],
                                    stride_xr, stride_xk, stride_wr, stride_wk, ONES)
            product = tl.where((product - product) == 0, product, 0.0)  # a special output never comes here
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17 = _peel_product(
                product, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17)
            k += BLOCK_K
        i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17 = _flush_lanes(
            i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17,
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17)
        k0 = end
    value = _rounded_float32(i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17)
    tl.store(result_ptr + out, value, mask=listed)


# --- accumulators on the device: carrying and rounding their planes -----------------------------

PLANES_BLOCK = 256  # outputs a program carries or rounds


@triton.jit
def _plane(planes_ptr, plane: tl.constexpr, P, at, inside):
    return tl.load(planes_ptr + plane * P + at, mask=inside, other=0)


@triton.jit
def _digits_of(planes_ptr, P, at, inside):
    """The 18 digit planes of outputs `at` of (WIDTH, P) planes."""
    return (_plane(planes_ptr, 0, P, at, inside), _plane(planes_ptr, 1, P, at, inside),
            _plane(planes_ptr, 2, P, at, inside), _plane(planes_ptr, 3, P, at, inside),
            _plane(planes_ptr, 4, P, at, inside), _plane(planes_ptr, 5, P, at, inside),
            _plane(planes_ptr, 6, P, at, inside), _plane(planes_ptr, 7, P, at, inside),
            _plane(planes_ptr, 8, P, at, inside), _plane(planes_ptr, 9, P, at, inside),
            _plane(planes_ptr, 10, P, at, inside), _plane(planes_ptr, 11, P, at, inside),
            _plane(planes_ptr, 12, P, at, inside), _plane(planes_ptr, 13, P, at, inside),
            _plane(planes_ptr, 14, P, at, inside), _plane(planes_ptr, 15, P, at, inside),
            _plane(planes_ptr, 16, P, at, inside), _plane(planes_ptr, 17, P, at, inside))


@triton.jit
def _put(planes_ptr, plane: tl.constexpr, P, at, inside, value):
    tl.store(planes_ptr + plane * P + at, value, mask=inside)


@triton.jit
def _put_digits(planes_ptr, P, at, inside, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14,
                d15, d16, d17):
    """The 18 digit planes of outputs `at` of (WIDTH, P) planes, stored: `_digits_of`'s inverse."""
    _put(planes_ptr, 0, P, at, inside, d0)
    _put(planes_ptr, 1, P, at, inside, d1)
    _put(planes_ptr, 2, P, at, inside, d2)
    _put(planes_ptr, 3, P, at, inside, d3)
    _put(planes_ptr, 4, P, at, inside, d4)
    _put(planes_ptr, 5, P, at, inside, d5)
    _put(planes_ptr, 6, P, at, inside, d6)
    _put(planes_ptr, 7, P, at, inside, d7)
    _put(planes_ptr, 8, P, at, inside, d8)
    _put(planes_ptr, 9, P, at, inside, d9)
    _put(planes_ptr, 10, P, at, inside, d10)
    _put(planes_ptr, 11, P, at, inside, d11)
    _put(planes_ptr, 12, P, at, inside, d12)
    _put(planes_ptr, 13, P, at, inside, d13)
    _put(planes_ptr, 14, P, at, inside, d14)
    _put(planes_ptr, 15, P, at, inside, d15)
    _put(planes_ptr, 16, P, at, inside, d16)
    _put(planes_ptr, 17, P, at, inside, d17)


@triton.jit(do_not_specialize=["P"])
def _normalise_planes(planes_ptr, P, BLOCK: tl.constexpr):
    """accumulator.normalise_ in place on (WIDTH, P) int64 planes: digits carried, counts 0 or 1."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < P
    (d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17) = \
        _digits_of(planes_ptr, P, at, inside)
    d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17 = _normalised(
        d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17)
    _put_digits(planes_ptr, P, at, inside, d0, d1, d2, d3, d4, d5, d6, d7, d8,
                d9, d10, d11, d12, d13, d14, d15, d16, d17)
    _put(planes_ptr, 18, P, at, inside, tl.minimum(_plane(planes_ptr, 18, P, at, inside), 1))
    _put(planes_ptr, 19, P, at, inside, tl.minimum(_plane(planes_ptr, 19, P, at, inside), 1))
    _put(planes_ptr, 20, P, at, inside, tl.minimum(_plane(planes_ptr, 20, P, at, inside), 1))


@triton.jit(do_not_specialize=["P"])
def _round_planes(planes_ptr, result_ptr, P, BLOCK: tl.constexpr):
    """rounding.round_planes into float32 for (WIDTH, P) int64 planes (carried or not): each
    exact value rounded once, then the special counts' rule (apply_special_counts)."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < P
    (d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17) = \
        _digits_of(planes_ptr, P, at, inside)
    value = _rounded_float32(d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17)
    up = _plane(planes_ptr, 19, P, at, inside) > 0
    down = _plane(planes_ptr, 20, P, at, inside) > 0
    nan = (_plane(planes_ptr, 18, P, at, inside) > 0) | (up & down)
    value = tl.where(up, float("inf"), value)
    value = tl.where(down, float("-inf"), value)
    value = tl.where(nan, float("nan"), value)
    tl.store(result_ptr + at, value, mask=inside)


# --- sums of rows picked by ids (scatter.py) ----------------------------------------------------------


@triton.jit(do_not_specialize=["D"])
def _scatter_sums(values_ptr, order_ptr, bounds_ptr, out_ptr, planes_ptr, D, PLANE, stride_t, stride_d,
                  DIGITS: tl.constexpr, BLOCK_D: tl.constexpr, FLUSH: tl.constexpr):
    """Program (r, j): columns j*BLOCK_D.. of row r, the exact sum of the value rows order[i] for
    i in bounds[r] .. bounds[r + 1] (the rows whose id is r, in the order of their ids), in
    Kulisch digit registers flushed every FLUSH rows; stored as carried digits (DIGITS) or
    rounded once to float32, NaN and infinite values counted apart."""
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    inside = cols < D
    start = tl.load(bounds_ptr + r)
    end = tl.load(bounds_ptr + r + 1)
    i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17 = _zeros(BLOCK_D, tl.int64)
    nan, up, down = i0, i0, i0
    k0 = start
    while k0 < end:
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17 = _zeros(BLOCK_D, tl.float64)
        stop = tl.minimum(k0 + FLUSH, end)
        k = k0
        while k < stop:
            token = tl.load(order_ptr + k)
            value = tl.load(values_ptr + token * stride_t + cols.to(tl.int64) * stride_d, mask=inside,
                            other=0.0).to(tl.float64)
            nan += (value != value).to(tl.int64)
            up += (value == float("inf")).to(tl.int64)
            down += (value == float("-inf")).to(tl.int64)
            value = tl.where((value - value) == 0, value, 0.0)
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17 = _peel_product(
                value, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17)
            k += 1
        i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17 = _flush(
            i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17,
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17)
        k0 = stop
    at = r.to(tl.int64) * D + cols
    if DIGITS:
        i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17 = _normalised(
            i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17)
        _put_digits(planes_ptr, PLANE, at, inside, i0, i1, i2, i3, i4, i5, i6, i7, i8,
                    i9, i10, i11, i12, i13, i14, i15, i16, i17)
        _put(planes_ptr, 18, PLANE, at, inside, tl.minimum(nan, 1))
        _put(planes_ptr, 19, PLANE, at, inside, tl.minimum(up, 1))
        _put(planes_ptr, 20, PLANE, at, inside, tl.minimum(down, 1))
    else:
        value = _rounded_float32(i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15, i16, i17)
        value = tl.where(up > 0, float("inf"), value)
        value = tl.where(down > 0, float("-inf"), value)
        value = tl.where((nan > 0) | ((up > 0) & (down > 0)), float("nan"), value)
        tl.store(out_ptr + at, value, mask=inside)
