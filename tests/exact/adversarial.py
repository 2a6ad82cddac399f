"""Operands that stress slicing under shared exponents: each a (name, x, w) case.

Shared by the CPU tests (against the Fraction oracle and the bins reference) and the GPU
cross-check, so that both see the same kinds of data.
"""

from __future__ import annotations

import torch

from exact_random import wide_random


def whole_range_rows(m: int, n: int, k: int, dtype: torch.dtype, generator: torch.Generator) -> tuple:
    """Every exponent from the smallest subnormal to the largest normal within each row."""
    exponents = torch.randint(-149, 127, (m + n, k), generator=generator).to(torch.float64)
    values = (1 + torch.rand((m + n, k), generator=generator, dtype=torch.float64)) * torch.exp2(exponents)
    signs = torch.where(torch.rand((m + n, k), generator=generator) < 0.5, -1.0, 1.0).to(torch.float64)
    both = (values * signs).clamp(-3.0e38, 3.0e38).to(torch.float32).to(dtype)
    return both[:m], both[m:]


def cancelling(m: int, n: int, k: int, dtype: torch.dtype, generator: torch.Generator) -> tuple:
    """Huge products that cancel exactly, leaving tiny ones: the sum is far below its terms."""
    half = k // 2
    x = wide_random((m, half), dtype, generator, 100)
    w = wide_random((n, half), dtype, generator, 100)
    tiny_x = wide_random((m, k - 2 * half + 2), dtype, generator, 2) * 2.0**-120
    tiny_w = wide_random((n, k - 2 * half + 2), dtype, generator, 2) * 2.0**-20
    return torch.cat([x, x, tiny_x.to(dtype)], 1), torch.cat([w, -w, tiny_w.to(dtype)], 1)


def subnormal(m: int, n: int, k: int, dtype: torch.dtype, generator: torch.Generator) -> tuple:
    """Subnormal and near-subnormal values, against values of every size."""
    low = torch.randint(1, 1 << 23, (m, k), generator=generator).to(torch.float64) * 2.0**-149
    signs = torch.where(torch.rand((m, k), generator=generator) < 0.5, -1.0, 1.0).to(torch.float64)
    return (low * signs).to(torch.float32).to(dtype), wide_random((n, k), dtype, generator, 120)


def one_outlier_per_row(m: int, n: int, k: int, dtype: torch.dtype, generator: torch.Generator) -> tuple:
    """randn rows with one element 2**60 larger: the shared exponent leaves the rest far below."""
    x, w = torch.randn((m, k), generator=generator), torch.randn((n, k), generator=generator)
    x[:, 0] *= 2.0**60
    w[:, -1] *= 2.0**-60
    return x.to(dtype), w.to(dtype)


def randn(m: int, n: int, k: int, dtype: torch.dtype, generator: torch.Generator) -> tuple:
    return torch.randn((m, k), generator=generator).to(dtype), torch.randn((n, k), generator=generator).to(dtype)


KINDS = {
    "randn": randn,
    "whole range in a row": whole_range_rows,
    "cancellation": cancelling,
    "subnormals": subnormal,
    "one outlier per row": one_outlier_per_row,
}
