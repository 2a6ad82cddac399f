"""The two short kernels whose rates give the recompute budget (probe.py): float32
multiply-adds bound by arithmetic, and a copy bound by memory bandwidth."""

import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def fma_rounds(x, out, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    value = tl.load(x + offsets)
    a = value * 0.5
    b = value + 0.25
    for _ in range(ROUNDS // 4):  # four independent chains keep the pipelines full
        a = a * 0.999 + 0.001
        b = b * 0.999 + 0.001
        a = a * 1.001 - 0.001
        b = b * 1.001 - 0.001
    tl.store(out + offsets, a + b)


def fma_work(device, elements: int, rounds: int):
    """A call that does `rounds` multiply-adds (contracted into FMAs) on each of `elements` floats."""
    import torch

    x = torch.rand(elements, device=device)
    out = torch.empty_like(x)
    grid = (elements // BLOCK,)
    return lambda: fma_rounds[grid](x, out, rounds, BLOCK)


def copy_work(device, nbytes: int):
    """A call that copies `nbytes` from one device buffer to another."""
    import torch

    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return lambda: target.copy_(source)
