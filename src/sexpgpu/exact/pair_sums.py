"""Compensated dot products for listed outputs of x @ w.T: det_gemm's second stage.

The outputs that the float64 product cannot settle are few and scattered, so no block of
rows and columns holds them; each is computed from its own row of x and row of w. Every
product is exact in float64 (float64_stage.py), and every addition of products or partial
sums is an error-free transformation (Knuth's TwoSum: s + e equals a + b exactly). The
sums' errors are collected and added in plain float64. So the exact dot product is

    exact = hi + sum_i err_i,       |err_i| <= u * (1 + u) * sum_k |p_k|,

for the final TwoSum sum hi and the n - 1 <= n error terms err_i, and with lo the float64
sum of the errors and result = fl(hi + lo),

    |exact - result| <= u |result| + gamma(n) * n * u * sum_k |p_k|                       (2)

(u = 2**-52, twice the unit roundoff; gamma as in float64_stage.py; the factor SLACK covers
the rest). sum_k |p_k| is at most ||x[m]|| ||w[n]||, the norms of the first stage. The
bound is about (n u)**2 of the terms' magnitude: near-zero outputs settle too, unless the
sum cancels to within that of zero or lies on a rounding boundary; those go on to the
exact accumulator.

How the terms are grouped does not matter to (2): on both the CPU and CUDA (a Triton kernel,
pair_kernel.py) each of a few lanes sums its columns along K by TwoSum first, and the lanes
are then combined by a pairwise tree of TwoSums.
"""

from __future__ import annotations

import torch

from . import implementations
from .float64_stage import SLACK, UNIT, gamma

PAIRS_PER_BATCH = 1 << 22  # products (pairs times K) the CPU path holds at once
LANES = 32  # the CPU path's lanes along K, as pair_kernel's


def pair_sums(x: torch.Tensor, w: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
              x_norm: torch.Tensor, w_norm: torch.Tensor):
    """(result, bound): x[rows[i]] . w[cols[i]] in float64 for finite bf16/f32 operands, with
    |exact - result| <= bound, inequality (2)."""
    if implementations.on_device(x.device):
        from .pair_kernel import lane_sums  # Triton is imported only where it runs

        summed = combined(*lane_sums(x, w, rows, cols))
    else:
        summed = _products_summed(x, w, rows, cols)
    return with_bound(summed, x_norm[rows] * w_norm[cols])


def with_bound(summed, magnitude: torch.Tensor):
    """(result, bound) from combined's (hi, lo, n) and magnitude >= sum_k |p_k|: inequality (2)."""
    hi, lo, terms = summed
    result = hi + lo
    return result, (result.abs() * UNIT + magnitude * (gamma(terms) * terms * UNIT)) * SLACK


def _products_summed(x, w, rows, cols):
    """The CPU path: exact float64 products of each pair's rows, summed by a TwoSum tree."""
    k = x.shape[1]
    step = max(1, PAIRS_PER_BATCH // max(k, 1))
    his, los = [], []
    terms = 1
    for start in range(0, rows.numel(), step):
        r, c = rows[start : start + step], cols[start : start + step]
        products = x[r].to(torch.float64) * w[c].to(torch.float64)
        hi, lo, terms = combined(*_lane_sums(products))
        his.append(hi)
        los.append(lo)
    if not his:
        empty = torch.zeros(0, dtype=torch.float64, device=x.device)
        return empty, empty, terms
    return torch.cat(his), torch.cat(los), terms


def _lane_sums(products: torch.Tensor):
    """(sums, errors, earlier_terms) as pair_kernel.lane_sums gives them, from (P, K) exact
    products: lane j adds columns j, j + LANES, ... by TwoSum. Columns LANES apart keep each
    step's operands in the caches, where a tree over all K would pass over them log2(K) times
    (1426 pairs of 1024: 3.6 ms against 20)."""
    pairs, k = products.shape
    steps = max(-(-k // LANES), 1)
    laid = torch.nn.functional.pad(products, (0, steps * LANES - k)).view(pairs, steps, LANES)
    total = torch.zeros((pairs, LANES), dtype=torch.float64, device=products.device)
    errors = torch.zeros_like(total)
    for step in range(steps):
        product = laid[:, step]
        new_total = total + product
        product_part = new_total - total
        errors += (total - (new_total - product_part)) + (product - product_part)
        total = new_total
    return total, errors, LANES * steps + steps


def combined(sums: torch.Tensor, errors: torch.Tensor, earlier_terms: int = 0):
    """(hi, lo, n): each row's lanes (sum, error) combined by a pairwise tree of TwoSums; n
    bounds both the number of error terms and the additions on any error's path to lo,
    counting `earlier_terms` for the lanes' own."""
    width = 1 << max(sums.shape[1] - 1, 0).bit_length()
    pad = width - sums.shape[1]
    sums = torch.nn.functional.pad(sums, (0, pad))
    errors = torch.nn.functional.pad(errors, (0, pad))
    levels = 0
    while sums.shape[1] > 1:
        a, b = sums[:, 0::2], sums[:, 1::2]
        total = a + b
        b_part = total - a
        error = (a - (total - b_part)) + (b - b_part)
        errors = errors[:, 0::2] + errors[:, 1::2] + error
        sums = total
        levels += 1
    return sums[:, 0], errors[:, 0], earlier_terms + width + 2 * levels
