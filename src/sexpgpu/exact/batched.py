"""Exact products of a batch of matrices, each output rounded once: attention's many small products.

    y = det_gemm_batched(x, w)        # y[b] = x[b] @ w[b].T; x (B, M, K), w (B, N, K)

Each output is the rounding of its exact sum, which is unique, so y[b] has the bits of
det_gemm(x[b], w[b]) (and of det_finalize(det_gemm_partial(x[b], w[b]))). The stages are
det_gemm's (bounded_gemm.py), run over the whole batch at once instead of matrix by matrix:

1. one batched float64 product, each output settled by float64_stage.py's bound, whose norms
   are its own rows' (so each matrix's bound is the one det_gemm would use);
2. compensated dot products (pair_sums.py) for the outputs left, each from its own row of x[b]
   and of w[b], found in the batch flattened into rows (B*M, K) and (B*N, K);
3. the exact accumulator for the few those leave (ties and cancellation below the bound).

Stage 3 of det_gemm (the tiers on a block of rows and columns) is left out: a batch's left
outputs are spread over its matrices. Operands holding NaN or infinities, more than
MAX_FAST_K terms, an empty product, or a forced implementation or tier path (for tests and
benchmarks) take det_gemm matrix by matrix.

On CUDA, float32 results take the queued path instead (queued.py): the same three stages with
no count read back, non-finite operands included.
"""

from __future__ import annotations

import torch

from . import implementations, queued
from .checks import check_operand, check_output_dtype
from .float64_stage import float64_product
from .gemm import accumulate_planes, rounded_product
from .pair_sums import pair_sums
from .paths import TIER_NAMES, forced_path
from .bounded_gemm import MAX_FAST_K, _exact_outputs, settle


def det_gemm_batched(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x @ w.transpose(1, 2) for x (B, M, K) and w (B, N, K): each output's exact sum rounded
    once into dtype (float32 or bfloat16)."""
    _check_batched(x, w)
    check_output_dtype("det_gemm_batched", dtype)
    implementations.select(x.device)  # a device no implementation runs on is refused here
    if queued.applies(x.device, dtype):
        return queued.queued_product(x, w)
    if _one_by_one(x, w):
        return _matrix_by_matrix(x, w, dtype)
    batch, m, k = x.shape
    n = w.shape[1]
    one = torch.ones((), dtype=torch.float64, device=x.device)
    first = float64_product(x, w)
    done, value = settle(first.total, first.bound(), one, dtype)
    result = torch.where(done, value, torch.zeros((), dtype=dtype, device=x.device))
    at_b, at_m, at_n = (~done).nonzero(as_tuple=True)
    if not at_b.numel():
        return result
    rows, cols = at_b * m + at_m, at_b * n + at_n  # the outputs' rows of the flattened operands
    flat_x, flat_w = x.reshape(batch * m, k), w.reshape(batch * n, k)
    refined, bound = pair_sums(flat_x, flat_w, rows, cols, first.x_norm.reshape(-1), first.w_norm.reshape(-1))
    settled, refined_value = settle(refined, bound, one, dtype)
    result[at_b, at_m, at_n] = torch.where(settled, refined_value, result[at_b, at_m, at_n])
    left = (~settled).nonzero()[:, 0]
    if left.numel():
        exact = _exact_outputs(flat_x, flat_w, rows[left], cols[left], dtype, accumulate_planes)
        result[at_b[left], at_m[left], at_n[left]] = exact
    return result


def _one_by_one(x: torch.Tensor, w: torch.Tensor) -> bool:
    forced = implementations.forcing() or forced_path() in TIER_NAMES
    if forced or x.numel() == 0 or w.numel() == 0 or x.shape[2] > MAX_FAST_K:
        return True
    return not bool(torch.isfinite(x).all() & torch.isfinite(w).all())  # one synchronisation


def _matrix_by_matrix(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    result = torch.empty((x.shape[0], x.shape[1], w.shape[1]), dtype=dtype, device=x.device)
    for index in range(x.shape[0]):
        result[index] = rounded_product(x[index], w[index], dtype)
    return result


def _check_batched(x, w) -> None:
    """x (B, M, K) and w (B, N, K) on one device with one dtype."""
    fn = "det_gemm_batched"
    check_operand(fn, "x", x)
    check_operand(fn, "w", w)
    if x.dim() != 3 or w.dim() != 3 or x.shape[0] != w.shape[0] or x.shape[2] != w.shape[2]:
        raise ValueError(f"{fn}: x must be (B, M, K) and w (B, N, K), got x of shape {tuple(x.shape)} and w of "
                         f"shape {tuple(w.shape)}; the product is x @ w.transpose(1, 2)")
    if x.dtype != w.dtype:
        raise TypeError(f"{fn}: x has dtype {x.dtype} and w has dtype {w.dtype}; they must be the same")
    if x.device != w.device:
        raise ValueError(f"{fn}: x is on {x.device} and w is on {w.device}; they must be on the same device")
