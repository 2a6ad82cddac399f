"""Random test tensors with a wide spread of exponents, random uneven K-shards and fold trees."""

from __future__ import annotations

import torch

from sexpgpu.exact import det_combine, det_gemm_partial

CPU_IMPLEMENTATIONS = ["bins", "int8", "fp64"]  # every CPU test runs with each (int8: the tensor-core arithmetic)
EVERY_CPU_IMPLEMENTATION = [*CPU_IMPLEMENTATIONS, "sliced"]  # checked against each other


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


def random_fold(accumulators, generator):
    """Combine in a random tree: repeatedly merge a random group of 2 or 3 partials."""
    pool = list(accumulators)
    while len(pool) > 1:
        order = torch.randperm(len(pool), generator=generator).tolist()
        size = min(len(pool), int(torch.randint(2, 4, (1,), generator=generator)))
        group = [pool[i] for i in order[:size]]
        pool = [pool[i] for i in order[size:]] + [det_combine(group)]
    return pool[0]


def shard_partials(x, w, cuts):
    bounds = [0, *cuts, x.shape[1]]
    return [det_gemm_partial(x[:, a:b], w[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
