"""The accumulator object and the carry normalisation that makes its digits canonical."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import implementations
from .layout import DIGITS, LOW_MASK, NAN_PLANE, RADIX_BITS, TOP, WIDTH


@dataclass(frozen=True, eq=False)
class Accumulator:
    """Exact partial sums for a tensor of outputs, as int64 planes of shape (WIDTH, *shape).

    The layout is described in `sexpgpu.exact.layout`. The digits are normalised: every
    digit but the top one lies in [0, 2**32) and the top one carries the sign, so two
    accumulators holding the same exact values hold equal tensors.
    """

    digits: torch.Tensor

    def __post_init__(self):
        planes = self.digits
        if not isinstance(planes, torch.Tensor) or planes.dtype != torch.int64:
            raise TypeError("Accumulator: digits must be an int64 tensor")
        if planes.dim() < 1 or planes.shape[0] != WIDTH:
            raise ValueError(f"Accumulator: digits must have {WIDTH} planes in dimension 0, got shape {tuple(planes.shape)}")

    @property
    def shape(self) -> torch.Size:
        return self.digits.shape[1:]

    @property
    def device(self) -> torch.device:
        return self.digits.device

    def __repr__(self) -> str:
        return f"Accumulator(shape={tuple(self.shape)}, device={self.device})"


def normalise_digits_(digits: torch.Tensor) -> torch.Tensor:
    """Carry every digit below the top into [0, 2**32), in place, keeping the value."""
    # Planes below the lowest non-zero one carry nothing: start there (most data reach
    # only the digits near the units).
    nonzero_planes = (digits[:TOP] != 0).reshape(TOP, -1).any(1).nonzero()
    start = int(nonzero_planes[0]) if nonzero_planes.numel() else TOP
    for plane in range(start, TOP):
        carry = digits[plane] >> RADIX_BITS  # arithmetic shift: the floor, also for negative digits
        digits[plane] &= LOW_MASK
        digits[plane + 1] += carry
    return digits


def normalise_(planes: torch.Tensor) -> torch.Tensor:
    """Make a (WIDTH, ...) plane tensor canonical, in place: digits carried, counts 0 or 1. On
    the device paths, one kernel that reads nothing back (queued_kernels._normalise_planes)."""
    if implementations.on_device(planes.device) and planes.is_contiguous() and planes[0].numel():
        from .queued_kernels import PLANES_BLOCK, _normalise_planes  # Triton is imported only where it runs

        outputs = planes[0].numel()
        _normalise_planes[(-(-outputs // PLANES_BLOCK),)](planes, outputs, BLOCK=PLANES_BLOCK, num_warps=4)
        return planes
    normalise_digits_(planes[:DIGITS])
    planes[NAN_PLANE:].clamp_(max=1)
    return planes


def empty_planes(shape, device) -> torch.Tensor:
    return torch.zeros((WIDTH, *shape), dtype=torch.int64, device=device)
