"""Exact GEMMs: partial sums into accumulators, their combination, and the one rounding."""

from __future__ import annotations

import torch

from . import implementations, queued
from .accumulator import Accumulator, empty_planes, normalise_
from .checks import check_accumulator, check_combinable, check_gemm_operands, check_output_dtype
from .layout import MAX_K_PER_CALL, NAN_PLANE
from .rounding import round_planes
from .bounded_gemm import rounded_gemm
from .special import split_special


def det_gemm_partial(x: torch.Tensor, w: torch.Tensor) -> Accumulator:
    """The exact x @ w.T, for x (M, K) and w (N, K), as an unrounded Accumulator of shape (M, N)."""
    check_gemm_operands("det_gemm_partial", x, w)
    return Accumulator(accumulate_planes(x, w))


def det_gemm(x: torch.Tensor, w: torch.Tensor, *, non_blocking: bool = False) -> torch.Tensor:
    """x @ w.T for x (M, K) and w (N, K): the exact sum of products, rounded once to float32.
    non_blocking=True: on CUDA, never wait for the device (queued.py), at the price of no
    tiers for data whose outputs the float64 bound mostly leaves."""
    check_gemm_operands("det_gemm", x, w)
    return rounded_product(x, w, torch.float32, non_blocking)


def rounded_product(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype, non_blocking: bool = False) -> torch.Tensor:
    """The exact x @ w.T rounded once into dtype: by the tiered fast path (bounded_gemm.py), which
    falls back to the accumulator where its bound cannot prove the rounding, or without a wait
    by the queued path (queued.py). With an implementation forced (implementations.forced), the
    accumulator computes every output."""
    implementations.select(x.device)  # a device no implementation runs on is refused here
    if non_blocking and queued.applies(x.device, dtype):
        return queued.queued_product(x, w)
    if implementations.forcing():
        return round_planes(accumulate_planes(x, w), dtype)
    x, w, special = split_special(x, w)
    return rounded_gemm(x, w, special, dtype, accumulate_planes)


def det_combine(accumulators) -> Accumulator:
    """The exact sum of partial sums of the same outputs (K-shards, in any grouping)."""
    check_combinable("det_combine", accumulators)
    total = accumulators[0].digits.clone()
    for acc in accumulators[1:]:
        total += acc.digits  # normalised digits are below 2**32: no overflow for < 2**30 terms
    return Accumulator(normalise_(total))


def det_finalize(acc: Accumulator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Round each exact sum once, to nearest with ties to even, into float32 (or bfloat16)."""
    check_accumulator("det_finalize", acc)
    check_output_dtype("det_finalize", dtype)
    return round_planes(acc.digits, dtype)


def accumulate_planes(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Normalised (WIDTH, M, N) planes of x @ w.T, in backend calls of at most MAX_K_PER_CALL."""
    backend = implementations.select(x.device)
    x, w, special = split_special(x, w)
    planes = None
    for k0 in range(0, x.shape[1], MAX_K_PER_CALL):
        part = backend.accumulate(x[:, k0 : k0 + MAX_K_PER_CALL], w[:, k0 : k0 + MAX_K_PER_CALL])
        planes = normalise_(part if planes is None else planes.add_(part))
    if planes is None:  # K == 0: the empty sum
        planes = empty_planes((x.shape[0], w.shape[0]), x.device)
    if special is not None:
        planes[NAN_PLANE:] += special
    return normalise_(planes)
