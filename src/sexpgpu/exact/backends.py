"""The kernel boundary: implementations of one function, `accumulate(x, w) -> planes`.

Contract of `accumulate`, which every implementation meets and tests/exact check:
  - x is (M, K) and w is (N, K), one dtype (torch.float32 or torch.bfloat16), one device,
    any strides, every element finite (the caller has counted NaN and infinities apart
    and put zeros in their place), and K <= layout.MAX_K_PER_CALL;
  - it returns an int64 tensor of shape (layout.WIDTH, M, N) on that device whose digits
    hold sum_k x[m, k] * w[n, k] exactly, every digit's magnitude below 2**62 (they need
    not be normalised), and whose last three planes are zero.

The public functions validate, chunk K, normalise and round; an implementation only adds.
A new implementation (a tensor-core one, say) registers itself here and is selected for
its device types, and the same tests run against it through `forced`.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Backend:
    name: str
    device_types: tuple[str, ...]
    module: str  # imported on first use, so that Triton loads only when it is needed
    function: str = "accumulate"

    def accumulate(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.load()(x, w)

    def load(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return getattr(importlib.import_module(self.module, __package__), self.function)


_REGISTRY: dict[str, Backend] = {}
_DEFAULT_FOR_DEVICE: dict[str, str] = {}
_forced: list[str] = []


def register(backend: Backend, default: bool = False) -> None:
    """Add an implementation; with default=True it becomes the one used on its device types."""
    _REGISTRY[backend.name] = backend
    if default:
        for device_type in backend.device_types:
            _DEFAULT_FOR_DEVICE[device_type] = backend.name


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> Backend:
    if name not in _REGISTRY:
        raise ValueError(f"sexpgpu.exact: no backend named {name!r}; the backends are {', '.join(names())}")
    return _REGISTRY[name]


def select(device: torch.device) -> Backend:
    """The implementation for tensors on `device`: a forced one if any, else the device's default."""
    if _forced:
        return get(_forced[-1])
    name = _DEFAULT_FOR_DEVICE.get(device.type)
    if name is None:
        raise ValueError(
            f"sexpgpu.exact: no implementation runs on {device.type} tensors; "
            f"use tensors on {' or '.join(sorted(_DEFAULT_FOR_DEVICE))}"
        )
    return get(name)


@contextlib.contextmanager
def forced(name: str):
    """Run every exact operation inside the block with the named backend (for tests and benchmarks)."""
    get(name)
    _forced.append(name)
    try:
        yield get(name)
    finally:
        _forced.pop()


# "bins" is the reference: integer arithmetic only, the simplest to check by reading.
register(Backend("bins", ("cpu",), ".bins_kernel"))
register(Backend("sliced", ("cpu", "cuda"), ".sliced_kernel"), default=True)  # default on CPU
register(Backend("triton", ("cuda",), ".triton_kernel"), default=True)  # default on CUDA
