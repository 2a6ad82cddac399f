"""The float64 product's settling on CUDA in one pass: bounded_gemm.settle's test, fused with the bound.

For each output it reads the float64 total and the two norms, forms the bound
(x_norm[m] * w_norm[n]) * factor exactly as Float64Product.bound does, and writes the float32
value and whether it is settled. The test is bounded_gemm.settle's, step for step, for float32
results (bfloat16 results take the torch path): the same comparisons of exact float64
differences, so both give the same outputs (tested). Contraction is off: the bound's product
and the midpoints are rounded as in torch. A batch of matrices (det_gemm_batched) settles in
the same pass, each matrix with its own rows' norms.

Triton passes a Python float to a compiled kernel as a float32 and to its interpreter as a
float64, so every factor handed to a kernel is a float32 already (float64_stage.upward_float32,
rounded up): the same number on both, and never below the bound it stands for.

`settled_float32` is the test as a device function, shared with the queued path's kernels
(queued_kernels.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N) by the outputs' width: long rows take long tiles, narrow ones the square
# one. On an H200, 4 warps: 4 x 512 settled 256 x 512 x 512 outputs in 0.244 ms (3.6 TB/s of
# float64 read and float32 and flags written), 8 x 512 in 0.329, 16 x 256 in 0.327, 32 x 64 in
# 0.335; 16384 x 24576 in 1.49 ms against 1.93 at 8 x 512.
WIDE_TILE, NARROW_TILE = (4, 512), (32, 64)
NUM_WARPS = 4


@triton.jit
def settled_float32(total, bound):
    """(settled, value) of bounded_gemm.settle for float32 results at scale 1: value is total's
    float32, +0.0 where the output is not settled or is an exact zero."""
    candidate = total.to(tl.float32)
    magnitude = tl.abs(candidate)
    bits = magnitude.to(tl.int32, bitcast=True)
    below = (bits - 1).to(tl.float32, bitcast=True).to(tl.float64)
    above = (bits + 1).to(tl.float32, bitcast=True).to(tl.float64)
    above = tl.where(above == float("inf"), 3.402823669209385e38, above)  # 2**128, the overflow point
    kept = magnitude.to(tl.float64)
    size = tl.abs(total)
    # halving by a product: the same rounding as a division by 2, without a division's instructions
    inside = ((size - (kept + below) * 0.5) > bound) & (((kept + above) * 0.5 - size) > bound)
    finite = magnitude < float("inf")
    exact = bound == 0
    exact_zero = exact & (total == 0)
    ordinary = (inside & (magnitude != 0) & finite) | (exact & (magnitude >= 1.1754943508222875e-38) & finite)
    done = ordinary | exact_zero
    return done, tl.where(done & ~exact_zero, candidate, 0.0)


@triton.jit(do_not_specialize=["M", "TILES_M"])  # N specialised: rows aligned to 16 load and store as vectors
def _settle_float32(total_ptr, x_norm_ptr, w_norm_ptr, value_ptr, done_ptr, M, N, TILES_M, factor,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # axis 0 walks the matrices' row tiles, matrix after matrix: TILES_M of them a matrix
    matrix = tl.program_id(0) // TILES_M
    rows = (tl.program_id(0) % TILES_M) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside_rows, inside_cols = rows < M, cols < N
    mask = inside_rows[:, None] & inside_cols[None, :]
    first = matrix.to(tl.int64) * M * N
    at = first + rows.to(tl.int64)[:, None] * N + cols[None, :]
    total = tl.load(total_ptr + at, mask=mask, other=0.0)
    x_norm = tl.load(x_norm_ptr + matrix.to(tl.int64) * M + rows, mask=inside_rows, other=0.0)
    w_norm = tl.load(w_norm_ptr + matrix.to(tl.int64) * N + cols, mask=inside_cols, other=0.0)
    bound = (x_norm[:, None] * w_norm[None, :]) * factor
    done, value = settled_float32(total, bound)
    tl.store(value_ptr + at, value, mask=mask)
    tl.store(done_ptr + at, done.to(tl.int8), mask=mask)


def settle_float32(total: torch.Tensor, x_norm: torch.Tensor, w_norm: torch.Tensor, factor: float, value=None):
    """(settled, value) as bounded_gemm.settle gives them for float32, with the bound formed in-kernel
    (factor a float32, Float64Product.factor); value is +0.0 where not settled. total (M, N)
    with norms (M,) and (N,), or a batch: total (B, M, N) with norms (B, M) and (B, N).
    value: a contiguous float32 tensor of total's shape to write the values into, or None."""
    m, n = total.shape[-2:]
    value = torch.empty(total.shape, dtype=torch.float32, device=total.device) if value is None else value
    done = torch.empty(total.shape, dtype=torch.int8, device=total.device)
    matrices = total.numel() // max(m * n, 1)
    if total.numel():
        block_m, block_n = WIDE_TILE if n >= WIDE_TILE[1] else NARROW_TILE
        tiles_m = triton.cdiv(m, block_m)
        grid = (matrices * tiles_m, triton.cdiv(n, block_n))
        _settle_float32[grid](total.contiguous(), x_norm.contiguous(), w_norm.contiguous(), value, done, m, n,
                              tiles_m, factor, BLOCK_M=block_m, BLOCK_N=block_n,
                              num_warps=NUM_WARPS, enable_fp_fusion=False)
    return done.view(torch.bool), value
