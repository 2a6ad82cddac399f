"""Parameter fingerprints on the GPU: the CPU definition (backends/cpu/fingerprint.py) as a
generated kernel, so that a step's digest reads 8 bytes a block instead of every parameter.

Each program mixes BLOCK words and adds them modulo 2^64 (uint64 arithmetic wraps); the
partial sums of all parameters land in one buffer that comes to the host in one copy, where
each parameter's partials are added modulo 2^64. Addition modulo 2^64 does not depend on
the order, so this is the CPU's fingerprint exactly.
"""

from __future__ import annotations

import numpy as np

from sexpgpu.backends.cpu.fingerprint import MIX_1, MIX_2
from sexpgpu.backends.cuda.codegen.compile import HEADER, GeneratedKernel

BLOCK = 4096
NUM_WARPS = 8


def _constant(value: int) -> str:
    return f"((tl.full([], {value >> 32}, tl.uint64) << 32) | tl.full([], {value & 0xFFFFFFFF}, tl.uint64))"


SOURCE = HEADER + f"""from sexpgpu.backends.cuda.codegen.bits import add


@triton.jit
def kernel(words, partials, n, first):
    block = tl.program_id(0)
    i = block.to(tl.int64) * {BLOCK} + tl.arange(0, {BLOCK})
    mask = i < n
    word = tl.load(words + i, mask=mask, other=0).to(tl.uint32, bitcast=True).to(tl.uint64)
    z = (i.to(tl.uint64) << 32) | word
    z = z ^ (z >> 30)
    z = z * {_constant(MIX_1)}
    z = z ^ (z >> 27)
    z = z * {_constant(MIX_2)}
    z = z ^ (z >> 31)
    z = tl.where(mask, z, z ^ z)
    tl.store(partials + first + block, tl.reduce(z, 0, add).to(tl.int64, bitcast=True))
"""


def fingerprints(values: list) -> list[int]:
    """The fingerprint of each tensor (float32 or bf16, on one device), with one copy to
    the host for all of them."""
    import torch

    if not values:
        return []
    words = [value.to(torch.float32).contiguous().view(torch.int32).reshape(-1) for value in values]
    blocks = [max(1, -(-word.numel() // BLOCK)) for word in words]
    partials = torch.zeros(sum(blocks), dtype=torch.int64, device=values[0].device)
    first = 0
    for word, count in zip(words, blocks):
        GeneratedKernel(SOURCE, (count,), NUM_WARPS, "fingerprint")(word, partials, word.numel(), first)
        first += count
    host = partials.cpu().numpy().view(np.uint64)
    bounds = np.cumsum([0] + blocks)
    return [int(host[start:stop].sum(dtype=np.uint64)) for start, stop in zip(bounds[:-1], bounds[1:])]
