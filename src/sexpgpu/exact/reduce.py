"""Exact sums along one dimension, rounded once."""

from __future__ import annotations

import math

import torch

from . import implementations, queued
from .accumulator import Accumulator, normalise_
from .checks import check_dim, check_operand, check_output_dtype
from .gemm import accumulate_planes, rounded_product
from .layout import MAX_K_PER_CALL, WIDTH
from .bounded_gemm import MAX_FAST_K
from .rounding import round_planes


def det_sum_partial(x: torch.Tensor, dim: int) -> Accumulator:
    """The exact sum of x along `dim`, unrounded: an Accumulator shaped like x without `dim`."""
    check_operand("det_sum_partial", "x", x)
    return Accumulator(_sum_planes("det_sum_partial", x, dim))


def det_sum(x: torch.Tensor, dim: int, keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The exact sum of x along `dim`, rounded once into `dtype` (x's dtype by default). On CUDA
    a float32 sum never waits for the device (queued.py), for any number of terms."""
    check_operand("det_sum", "x", x)
    dtype = x.dtype if dtype is None else dtype
    check_output_dtype("det_sum", dtype)
    rows, flat = _flat_rows("det_sum", x, dim)
    implementations.select(x.device)  # a device no implementation runs on is refused here
    if queued.applies(x.device, dtype):
        total = queued.queued_sum(flat).reshape(rows.shape[:-1])
    elif flat.shape[1] > MAX_FAST_K:
        total = round_planes(_long_sum_planes(flat), dtype).reshape(rows.shape[:-1])
    else:
        ones = torch.ones((1, flat.shape[1]), dtype=x.dtype, device=x.device)
        total = rounded_product(flat, ones, dtype).reshape(rows.shape[:-1])  # det_gemm's fast path
    return total.unsqueeze(dim % x.dim()) if keepdim else total


def _long_sum_planes(flat: torch.Tensor) -> torch.Tensor:
    """Normalised planes of each row's sum, for rows longer than the fast path takes (a gradient
    norm over every parameter): cut into pieces of MAX_K_PER_CALL summed in one call (more
    rows) instead of K chunks summed in turn, their digits added."""
    count, width = flat.shape[1], MAX_K_PER_CALL
    pieces = -(-count // width)
    laid = torch.nn.functional.pad(flat, (0, pieces * width - count))  # zeros add nothing
    parts = _sum_planes("det_sum", laid.reshape(flat.shape[0], pieces, width), -1)  # (WIDTH, P, pieces)
    return normalise_(parts.sum(-1))  # below 2**30 pieces of digits under 2**32: no overflow


def _sum_planes(fn: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    # A sum is a product with a row of ones: (P, K) @ (1, K).T, exact like any other.
    rows, flat = _flat_rows(fn, x, dim)
    ones = torch.ones((1, flat.shape[1]), dtype=x.dtype, device=x.device)
    return accumulate_planes(flat, ones).reshape(WIDTH, *rows.shape[:-1])


def _flat_rows(fn: str, x: torch.Tensor, dim: int):
    """(x with dim moved last, the same as a (P, K) matrix)."""
    rows = x.movedim(check_dim(fn, x, dim), -1)
    return rows, rows.reshape(math.prod(rows.shape[:-1]), rows.shape[-1])
