"""Exact sums along one dimension, rounded once."""

from __future__ import annotations

import math

import torch

from .accumulator import Accumulator
from .checks import check_dim, check_operand, check_output_dtype
from .gemm import accumulate_planes
from .layout import WIDTH
from .rounding import round_planes


def det_sum_partial(x: torch.Tensor, dim: int) -> Accumulator:
    """The exact sum of x along `dim`, unrounded: an Accumulator shaped like x without `dim`."""
    check_operand("det_sum_partial", "x", x)
    return Accumulator(_sum_planes("det_sum_partial", x, dim))


def det_sum(x: torch.Tensor, dim: int, keepdim: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The exact sum of x along `dim`, rounded once into `dtype` (x's dtype by default)."""
    check_operand("det_sum", "x", x)
    dtype = x.dtype if dtype is None else dtype
    check_output_dtype("det_sum", dtype)
    total = round_planes(_sum_planes("det_sum", x, dim), dtype)
    return total.unsqueeze(dim % x.dim()) if keepdim else total


def _sum_planes(fn: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    # A sum is a product with a row of ones: (P, K) @ (1, K).T, exact like any other.
    dim = check_dim(fn, x, dim)
    rows = x.movedim(dim, -1)
    flat = rows.reshape(math.prod(rows.shape[:-1]), rows.shape[-1])
    ones = torch.ones((1, flat.shape[1]), dtype=x.dtype, device=x.device)
    return accumulate_planes(flat, ones).reshape(WIDTH, *rows.shape[:-1])
