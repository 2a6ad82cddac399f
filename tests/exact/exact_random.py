"""Random test tensors with a wide spread of exponents, and random uneven shard boundaries."""

from __future__ import annotations

import torch


def wide_random(shape, dtype: torch.dtype, generator: torch.Generator, spread: int = 60) -> torch.Tensor:
    """Normal values scaled by 2**e for e uniform in [-spread, spread), with some exact zeros."""
    scale = torch.exp2(torch.randint(-spread, spread, shape, generator=generator).to(torch.float32))
    values = torch.randn(shape, generator=generator) * scale
    zeros = torch.rand(shape, generator=generator) < 0.05
    return torch.where(zeros, torch.zeros(()), values).to(dtype)


def random_cuts(k: int, parts: int, generator: torch.Generator) -> list[int]:
    """parts - 1 sorted cut points in [0, k]: uneven shards, some possibly empty."""
    cuts = torch.randint(0, k + 1, (parts - 1,), generator=generator).sort().values
    return cuts.tolist()
