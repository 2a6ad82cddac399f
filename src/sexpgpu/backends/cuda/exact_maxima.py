"""An exact graph's maxima over trailing axes in one pass: exact_ops.maxima's value, its rule
for signed zeros and NaN included, read once.

A maximum rounds nothing, so any order gives it; what needs care is the interpreter's rule
(cpu/folds.reduce_max): NaN where any element is NaN, and where the largest is a zero, +0
if some zero is +0, else -0. Each row keeps three things in one pass: the largest non-NaN
value, whether some element's bits are all zero (+0 is the one such float), and the largest
bit pattern among its NaNs (the NaN it returns; a row's NaNs share one pattern wherever the
float math made them). exact_ops.maxima takes two passes and a where; in an exact gpt-50m
step the maxima (the softmax rows and the logits' rows) took 7.1 ms of the microbatch on an
H200. Other axes, empty rows and non-float32 tensors take exact_ops.maxima.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from sexpgpu.backends import exact_ops as ops
from sexpgpu.exact.float64_stage import tile_width

TILE = 2048  # elements of a program's tile
LANES = 128  # its columns along a row


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit(do_not_specialize=["R", "K"])
def _row_maxima(x_ptr, out_ptr, R, K, stride_r, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    inside_rows = rows < R
    largest = tl.full([BLOCK_R, BLOCK_K], float("-inf"), tl.float32)
    positive_zero = tl.full([BLOCK_R, BLOCK_K], 0, tl.int32)
    nan_bits = tl.full([BLOCK_R, BLOCK_K], -2147483648, tl.int32)  # below every NaN's bits as int32
    k0 = 0
    while k0 < K:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = inside_rows[:, None] & (k < K)[None, :]
        value = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_r + k[None, :], mask=mask, other=float("-inf"))
        bits = value.to(tl.int32, bitcast=True)
        is_nan = value != value
        largest = tl.maximum(largest, tl.where(is_nan, float("-inf"), value))
        positive_zero = tl.maximum(positive_zero, (bits == 0).to(tl.int32))
        nan_bits = tl.maximum(nan_bits, tl.where(is_nan, bits, -2147483648))
        k0 += BLOCK_K
    top = tl.reduce(largest, 1, _larger)
    # the zero's bits: 0 for +0, the sign bit alone for -0 (a literal -0.0 loses its sign in Triton)
    zero = tl.where(tl.reduce(positive_zero, 1, _larger) > 0, 0, -2147483648).to(tl.float32, bitcast=True)
    top = tl.where(top == 0, zero, top)
    nans = tl.reduce(nan_bits, 1, _larger)
    top = tl.where(nans != -2147483648, nans.to(tl.float32, bitcast=True), top)
    tl.store(out_ptr + rows, top, mask=inside_rows)


def _rows(x: torch.Tensor, k: int):
    """x as rows (R, k) each contiguous, a view; None where that takes a copy."""
    try:
        rows = x.view(-1, k)
    except RuntimeError:
        return None
    return rows if rows.stride(1) == 1 or k == 1 else None


def maxima(x: torch.Tensor, axes, keep: bool = False) -> torch.Tensor:
    """exact_ops.maxima(x, axes, keep), in one pass where the axes are x's last ones and each
    row lies contiguous."""
    axes = tuple(sorted(axis % max(x.dim(), 1) for axis in axes))
    trailing = axes == tuple(range(x.dim() - len(axes), x.dim()))
    k = math.prod(x.shape[x.dim() - len(axes):]) if axes else 0
    rows = _rows(x, k) if trailing and k and x.dtype == torch.float32 else None
    if rows is None:
        return ops.maxima(x, axes, keep)
    r = rows.shape[0]
    out = torch.empty(r, dtype=torch.float32, device=x.device)
    if r:
        block_k = min(LANES, tile_width(k))
        block_r = TILE // block_k
        _row_maxima[(triton.cdiv(r, block_r),)](rows, out, r, k, rows.stride(0), BLOCK_R=block_r, BLOCK_K=block_k,
                                                 num_warps=4)
    kept = [1 if axis in axes else size for axis, size in enumerate(x.shape)] if keep else \
        [size for axis, size in enumerate(x.shape) if axis not in axes]
    return out.reshape(kept)
