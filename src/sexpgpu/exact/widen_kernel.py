"""An operand's rows in float64 and their norms' bound, in one pass on CUDA (float64_stage.widened).

`_widen` reads each row once and writes it contiguous in float64, and the sum of its squares.
A row holding an infinity or a NaN keeps them, and has an infinite or NaN norm, so that no
bound settles its outputs. The squares are exact in float64 (at most 48 significant bits);
their sum is bounded for any order, so the factor handed in covers both the sum's rounding
and the square root's. Long rows are cut into segments, a program each, so that an operand
of few rows (a weight's gradient over every token: 512 rows of 16384) still fills the GPU;
the segments' partial sums are then added. It replaces a conversion, a squared copy and a
sum, each a pass over the operand. The tile, the segments and the factor are
float64_stage.widened's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Triton's tl.sum is a @triton.jit function, compiled or interpreted as Triton was first
# imported; tl.reduce with Triton's own adding combiner is inlined by both (queued_kernels.py).
_ADD = tl.standard._sum_combine


@triton.jit(do_not_specialize=["R", "ROWS", "SEGMENT"])  # K specialised: rows aligned to 16 store as vectors
def _widen(x_ptr, wide_ptr, out_ptr, R, ROWS, K, stride_b, stride_r, stride_k, SEGMENT, raise_factor,
           NORM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    # program (i, s): rows i*BLOCK_R.., columns of segment s; row r is row r % ROWS of matrix
    # r // ROWS. NORM (one segment): out is the norm's bound, raise_factor >= 1 + gamma(D) for
    # the squares' sum and >= SLACK for the square root; else out (R, segments) holds each
    # segment's sum of squares.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    segment = tl.program_id(1)
    inside_rows = rows < R
    matrix = rows // ROWS
    starts = matrix.to(tl.int64) * stride_b + (rows - matrix * ROWS).to(tl.int64) * stride_r
    end = tl.minimum((segment + 1).to(tl.int64) * SEGMENT, K)
    squares = tl.full([BLOCK_R, BLOCK_K], 0.0, tl.float64)
    k0 = segment.to(tl.int64) * SEGMENT
    while k0 < end:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = inside_rows[:, None] & (k < end)[None, :]
        value = tl.load(x_ptr + starts[:, None] + k[None, :] * stride_k, mask=mask, other=0.0).to(tl.float64)
        squares += value * value  # exact: at most 48 significant bits; inf or NaN stays so
        tl.store(wide_ptr + rows.to(tl.int64)[:, None] * K + k[None, :], value, mask=mask)
        k0 += BLOCK_K
    total = tl.reduce(squares, 1, _ADD)
    if NORM:
        tl.store(out_ptr + rows, tl.sqrt(total * raise_factor) * raise_factor, mask=inside_rows)
    else:
        tl.store(out_ptr + rows.to(tl.int64) * tl.num_programs(1) + segment, total, mask=inside_rows)


def widen(rows: torch.Tensor, block_r: int, block_k: int, segment: int, raise_factor: float) -> tuple:
    """(wide (R, K), norm) of float32 rows (R, K), or of the matrices' rows of rows (B, M, K)
    (R = B * M), of any strides, by tiles of block_r x block_k, each program taking `segment`
    columns of its rows."""
    matrices = rows if rows.dim() == 3 else rows[None]
    b, m, k = matrices.shape
    r = b * m
    wide = torch.empty((r, k), dtype=torch.float64, device=rows.device)
    segments = max(-(-k // segment), 1)
    out = torch.empty((r, segments) if segments > 1 else (r,), dtype=torch.float64, device=rows.device)
    if r:
        _widen[(-(-r // block_r), segments)](matrices, wide, out, r, max(m, 1), k, *matrices.stride(), segment,
                                             raise_factor, NORM=segments == 1, BLOCK_R=block_r, BLOCK_K=block_k,
                                             num_warps=4, enable_fp_fusion=False)
    if segments == 1:
        return wide, out
    return wide, out.sum(1).mul_(raise_factor).sqrt_().mul_(raise_factor)
