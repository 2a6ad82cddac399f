"""The CUDA implementation of `accumulate`, in Triton: exact fp64 products peeled into digits.

A product of two bf16 or f32 values is exact in fp64. Each program owns a tile of outputs
and one fp64 register per digit and output. For each k it peels the product, from the top
digit down, into parts that are multiples of the digit's weight 2**(32 * (d - 10)):
adding and subtracting 1.5 * 2**(52 + weight exponent) rounds the remainder to such a
multiple, and the difference is exact. Each part is at most 2**31 (2**32 for the top digit)
times the weight, so 2**19 of them sum exactly in fp64; the sums become int64 digits at
the end. This runs on the fp64 scalar cores; a tensor-core implementation registers
beside it in `implementations` and is held to the same tests.

Correct first: no data-dependent shortcuts, one k at a time. Every tile size gives the same
digits, because every addition is exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import DIGITS, WIDTH

BLOCK_M = 32
BLOCK_N = 32
NUM_WARPS = 8

# The numbers below are layout's (radix 2**32, plane 10 the units) and fp64's (52 fraction
# bits, exponent bias 1023), written out because Triton kernels take literal constants.


@triton.jit
def _fp64_from_bits(bits: tl.constexpr):
    return tl.full([], bits, tl.int64).to(tl.float64, bitcast=True)


@triton.jit
def _peel(rest, acc, digit: tl.constexpr):
    """Move the part of `rest` that is a multiple of digit's weight into `acc`; both exact."""
    # 1.5 * 2**(52 + 32 * (digit - 10)): adding and subtracting it rounds to that multiple.
    shifter = _fp64_from_bits(((1023 + 52 + 32 * (digit - 10)) << 52) | (1 << 51))
    part = (rest + shifter) - shifter
    return rest - part, acc + part


@triton.jit
def _store_digit(out_ptr, plane_size, offsets, mask, acc, digit: tl.constexpr):
    scale = _fp64_from_bits((1023 - 32 * (digit - 10)) << 52)  # 2**-(32 * (digit - 10))
    tl.store(out_ptr + digit * plane_size + offsets, (acc * scale).to(tl.int64), mask=mask)


@triton.jit
def _peel_product(rest, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17):
    """Add one exact product (or a tile of them) into the 18 digit registers, top digit first."""
    rest, a17 = _peel(rest, a17, 17)
    rest, a16 = _peel(rest, a16, 16)
    rest, a15 = _peel(rest, a15, 15)
    rest, a14 = _peel(rest, a14, 14)
    rest, a13 = _peel(rest, a13, 13)
    rest, a12 = _peel(rest, a12, 12)
    rest, a11 = _peel(rest, a11, 11)
    rest, a10 = _peel(rest, a10, 10)
    rest, a9 = _peel(rest, a9, 9)
    rest, a8 = _peel(rest, a8, 8)
    rest, a7 = _peel(rest, a7, 7)
    rest, a6 = _peel(rest, a6, 6)
    rest, a5 = _peel(rest, a5, 5)
    rest, a4 = _peel(rest, a4, 4)
    rest, a3 = _peel(rest, a3, 3)
    rest, a2 = _peel(rest, a2, 2)
    rest, a1 = _peel(rest, a1, 1)
    a0 += rest  # a product's lowest bit is 2**-298 or above: what is left is a multiple of 2**-320
    return a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17


@triton.jit
def _store_digits(out_ptr, plane_size, offsets, mask, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17):
    _store_digit(out_ptr, plane_size, offsets, mask, a0, 0)
    _store_digit(out_ptr, plane_size, offsets, mask, a1, 1)
    _store_digit(out_ptr, plane_size, offsets, mask, a2, 2)
    _store_digit(out_ptr, plane_size, offsets, mask, a3, 3)
    _store_digit(out_ptr, plane_size, offsets, mask, a4, 4)
    _store_digit(out_ptr, plane_size, offsets, mask, a5, 5)
    _store_digit(out_ptr, plane_size, offsets, mask, a6, 6)
    _store_digit(out_ptr, plane_size, offsets, mask, a7, 7)
    _store_digit(out_ptr, plane_size, offsets, mask, a8, 8)
    _store_digit(out_ptr, plane_size, offsets, mask, a9, 9)
    _store_digit(out_ptr, plane_size, offsets, mask, a10, 10)
    _store_digit(out_ptr, plane_size, offsets, mask, a11, 11)
    _store_digit(out_ptr, plane_size, offsets, mask, a12, 12)
    _store_digit(out_ptr, plane_size, offsets, mask, a13, 13)
    _store_digit(out_ptr, plane_size, offsets, mask, a14, 14)
    _store_digit(out_ptr, plane_size, offsets, mask, a15, 15)
    _store_digit(out_ptr, plane_size, offsets, mask, a16, 16)
    _store_digit(out_ptr, plane_size, offsets, mask, a17, 17)


@triton.jit(do_not_specialize=["M", "N"])
def _kulisch_gemm(
    x_ptr, w_ptr, out_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    x_row = x_ptr + rows.to(tl.int64) * stride_xm
    w_row = w_ptr + cols.to(tl.int64) * stride_wn
    a0 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a1 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a2 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a3 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a4 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a5 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a6 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a7 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a8 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a9 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a10 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a11 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a12 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a13 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a14 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a15 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a16 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    a17 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float64)
    # A while loop rather than range(K): Triton 3.6's interpreter cannot take a runtime
    # range bound under NumPy 2.4, and CI runs this kernel in the interpreter.
    k = 0
    while k < K:
        xv = tl.load(x_row + k * stride_xk, mask=row_ok, other=0.0).to(tl.float64)
        wv = tl.load(w_row + k * stride_wk, mask=col_ok, other=0.0).to(tl.float64)
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17 = _peel_product(xv[:, None] * wv[None, :], a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17)
        k += 1
    offsets = rows.to(tl.int64)[:, None] * N + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    _store_digits(out_ptr, M.to(tl.int64) * N, offsets, mask, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17)


@triton.jit(do_not_specialize=["P", "K"])
def _kulisch_pairs(
    x_ptr, w_ptr, rows_ptr, cols_ptr, out_ptr, P, K,
    stride_xm, stride_xk, stride_wn, stride_wk, BLOCK: tl.constexpr, K_PART: tl.constexpr,
):
    # Program (i, j) adds columns [j K_PART, (j + 1) K_PART) of its BLOCK outputs into planes
    # slab j: a few outputs then still keep many programs busy, not one walking all of K.
    pairs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    listed = pairs < P
    part = tl.program_id(1)
    out_ptr += part.to(tl.int64) * 18 * P  # WIDTH planes less the three special ones, per slab
    x_row = x_ptr + tl.load(rows_ptr + pairs, mask=listed, other=0).to(tl.int64) * stride_xm
    w_row = w_ptr + tl.load(cols_ptr + pairs, mask=listed, other=0).to(tl.int64) * stride_wn
    a0 = tl.full((BLOCK,), 0.0, tl.float64)
    a1 = tl.full((BLOCK,), 0.0, tl.float64)
    a2 = tl.full((BLOCK,), 0.0, tl.float64)
    a3 = tl.full((BLOCK,), 0.0, tl.float64)
    a4 = tl.full((BLOCK,), 0.0, tl.float64)
    a5 = tl.full((BLOCK,), 0.0, tl.float64)
    a6 = tl.full((BLOCK,), 0.0, tl.float64)
    a7 = tl.full((BLOCK,), 0.0, tl.float64)
    a8 = tl.full((BLOCK,), 0.0, tl.float64)
    a9 = tl.full((BLOCK,), 0.0, tl.float64)
    a10 = tl.full((BLOCK,), 0.0, tl.float64)
    a11 = tl.full((BLOCK,), 0.0, tl.float64)
    a12 = tl.full((BLOCK,), 0.0, tl.float64)
    a13 = tl.full((BLOCK,), 0.0, tl.float64)
    a14 = tl.full((BLOCK,), 0.0, tl.float64)
    a15 = tl.full((BLOCK,), 0.0, tl.float64)
    a16 = tl.full((BLOCK,), 0.0, tl.float64)
    a17 = tl.full((BLOCK,), 0.0, tl.float64)
    k = part * K_PART
    end = tl.minimum(k + K_PART, K)
    while k < end:
        xv = tl.load(x_row + k * stride_xk, mask=listed, other=0.0).to(tl.float64)
        wv = tl.load(w_row + k * stride_wk, mask=listed, other=0.0).to(tl.float64)
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17 = _peel_product(xv * wv, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17)
        k += 1
    _store_digits(out_ptr, P.to(tl.int64), pairs.to(tl.int64), listed, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17)


def accumulate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # bf16 widens to f32 exactly. The kernel reads f32 only: one conversion path to get right,
    # and Triton 3.6's interpreter widens bf16 subnormals wrongly.
    x, w = x.to(torch.float32), w.to(torch.float32)
    M, K = x.shape
    N = w.shape[0]
    planes = torch.empty((WIDTH, M, N), dtype=torch.int64, device=x.device)
    planes[DIGITS:].zero_()
    if M == 0 or N == 0:
        return planes.zero_()
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _kulisch_gemm[grid](
        x, w, planes, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS,
    )
    return planes


PAIRS_BLOCK = 128
PAIRS_K_PART = 256  # columns of K one program adds; the slabs' digits are summed afterwards
PAIRS_SLAB_ELEMENTS = 1 << 26  # int64 digits of slabs held at once (512 MB)


def accumulate_pairs(x: torch.Tensor, w: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The exact x[rows[i]] . w[cols[i]] as int64 planes (WIDTH, P), unnormalised, special planes
    zero: `accumulate`'s contract for a list of outputs, for finite operands and K <= MAX_K_PER_CALL."""
    x, w = x.to(torch.float32), w.to(torch.float32)
    count, k = rows.numel(), x.shape[1]
    parts = max(triton.cdiv(k, PAIRS_K_PART), 1)
    planes = torch.zeros((WIDTH, count), dtype=torch.int64, device=x.device)
    step = max(PAIRS_BLOCK, PAIRS_SLAB_ELEMENTS // (parts * DIGITS))
    for start in range(0, count, step):
        batch = min(step, count - start)
        slabs = torch.zeros((parts, DIGITS, batch), dtype=torch.int64, device=x.device)
        _kulisch_pairs[(triton.cdiv(batch, PAIRS_BLOCK), parts)](
            x, w, rows[start : start + batch].contiguous(), cols[start : start + batch].contiguous(), slabs,
            batch, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1), BLOCK=PAIRS_BLOCK,
            K_PART=PAIRS_K_PART, num_warps=4,
        )
        # a slab's digits sum 256 parts below 2**32; 2**11 slabs of them stay below 2**51
        planes[:DIGITS, start : start + batch] = slabs.sum(0)
    return planes
