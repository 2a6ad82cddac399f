"""pair_sums.py's CUDA path: each listed output's dot product, summed along K by error-free additions.

A program takes BLOCK_P listed outputs (row of x, row of w) and walks K in steps of BLOCK_K:
lane j of an output adds the exact float64 products of columns j, j + BLOCK_K, ... by TwoSum
into its sum and collects each addition's error into its error sum. The lanes are combined
afterwards by pair_sums' TwoSum tree, whose bound counts the lanes' additions
(`earlier_terms`). Floating-point contraction is off: TwoSum needs each addition rounded
on its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# 32 outputs of 32 lanes: pair_sums of 234,047 outputs at K = 8192 in 2.58 ms on an H200,
# against 2.74 for 64 of 16 and 3.13 to 4.39 for 64 lanes or more (a deeper tree afterwards)
BLOCK_P = 32
BLOCK_K = 32  # lanes a TwoSum tree joins afterwards: few levels of small torch operations
NUM_WARPS = 4


@triton.jit(do_not_specialize=["P", "K"])
def _lane_sums(x_ptr, w_ptr, rows_ptr, cols_ptr, sums_ptr, errors_ptr, P, K, stride_x, stride_w,
               BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):
    pairs = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    listed = pairs < P
    rows = tl.load(rows_ptr + pairs, mask=listed, other=0).to(tl.int64)
    cols = tl.load(cols_ptr + pairs, mask=listed, other=0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_K)
    total = tl.full([BLOCK_P, BLOCK_K], 0.0, tl.float64)
    errors = tl.full([BLOCK_P, BLOCK_K], 0.0, tl.float64)
    # A while loop rather than range(K): Triton 3.6's interpreter cannot take a runtime range
    # bound under NumPy 2.4, and CI runs this kernel in the interpreter.
    k0 = 0
    while k0 < K:
        k = k0 + lanes
        inside = listed[:, None] & (k < K)[None, :]
        a = tl.load(x_ptr + rows[:, None] * stride_x + k[None, :], mask=inside, other=0.0).to(tl.float64)
        b = tl.load(w_ptr + cols[:, None] * stride_w + k[None, :], mask=inside, other=0.0).to(tl.float64)
        product = a * b  # exact: at most 48 significant bits
        new_total = total + product
        product_part = new_total - total
        errors += (total - (new_total - product_part)) + (product - product_part)
        total = new_total
        k0 += BLOCK_K
    at = pairs.to(tl.int64)[:, None] * BLOCK_K + lanes[None, :]
    tl.store(sums_ptr + at, total, mask=listed[:, None])
    tl.store(errors_ptr + at, errors, mask=listed[:, None])


def lane_sums(x: torch.Tensor, w: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor):
    """(sums, errors, earlier_terms): (P, BLOCK_K) float64 lane sums and error sums of the
    listed outputs, and a bound of both the lanes' error terms and the additions on a lane."""
    x, w = x.float().contiguous(), w.float().contiguous()  # bf16 widens exactly
    count, k = rows.numel(), x.shape[1]
    sums = torch.empty((count, BLOCK_K), dtype=torch.float64, device=x.device)
    errors = torch.empty_like(sums)
    if count:
        grid = (triton.cdiv(count, BLOCK_P),)
        _lane_sums[grid](x, w, rows.contiguous(), cols.contiguous(), sums, errors, count, k,
                         x.stride(0), w.stride(0), BLOCK_P=BLOCK_P, BLOCK_K=BLOCK_K,
                         num_warps=NUM_WARPS, enable_fp_fusion=False)
    steps = -(-k // BLOCK_K)
    return sums, errors, BLOCK_K * steps + steps  # the lanes' error terms, and a lane's additions
