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
class Implementation:
    name: str
    device_types: tuple[str, ...]
    module: str  # imported on first use, so that Triton loads only when it is needed
    function: str = "accumulate"
    requires: str | None = None  # a key of REQUIREMENTS that a device must meet for it to be the default

    def runs_on(self, device: torch.device) -> bool:
        return self.requires is None or REQUIREMENTS[self.requires](device)

    def accumulate(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.load()(x, w)

    def load(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return getattr(importlib.import_module(self.module, __package__), self.function)


_REGISTRY: dict[str, Implementation] = {}
_DEFAULTS_FOR_DEVICE: dict[str, list[str]] = {}  # the first that runs on the device is used
_forced: list[str] = []
_device_paths: list[bool] = []  # device_paths() in effect, innermost last: whether CPU tensors take CUDA's paths


def int8_tensor_cores(device: torch.device) -> bool:
    """Whether int8 slice products are the device's (its tensor cores, or their CPU stand-in)."""
    # Ampere (8.0) and later run cuBLASLt's int8 products, with int32 sums, on tensor cores;
    # CPU tensors on the device paths multiply int8 slices through the cores' exact stand-in.
    return device.type == "cpu" or torch.cuda.get_device_capability(device) >= (8, 0)


@contextlib.contextmanager
def device_paths(on: bool = True):
    """Inside the block, CPU tensors take the paths CUDA tensors take: the Triton kernels (run
    by Triton's interpreter, TRITON_INTERPRET=1), int8 slices multiplied by the tensor cores'
    exact stand-in. Bits are the same either way; this lets a machine without a GPU run, test
    and count what a GPU runs (the CUDA backend on CPU tensors enters it). device_paths(False)
    inside such a block gives CPU tensors their own paths again."""
    _device_paths.append(on)
    try:
        yield
    finally:
        _device_paths.pop()


def on_device(device: torch.device) -> bool:
    """Whether tensors on `device` take the device paths: CUDA tensors, or CPU ones inside device_paths()."""
    return device.type == "cuda" or (device.type == "cpu" and bool(_device_paths) and _device_paths[-1])


def launch_kind(device: torch.device) -> str:
    """"compiled" for CUDA tensors, "interpreted" for CPU ones on the device paths (Triton's
    interpreter): the kernels' grids and tiles are chosen by it, never their bits."""
    return "compiled" if device.type == "cuda" else "interpreted"


REQUIREMENTS = {"int8 tensor cores": int8_tensor_cores}


def register(backend: Implementation, default_on: tuple[str, ...] = ()) -> None:
    """Add an implementation; it becomes the one used on the device types `default_on` (on
    devices that meet its requirement; the previous default stays as the fallback)."""
    _REGISTRY[backend.name] = backend
    for device_type in default_on:
        _DEFAULTS_FOR_DEVICE.setdefault(device_type, []).insert(0, backend.name)


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> Implementation:
    if name not in _REGISTRY:
        raise ValueError(f"sexpgpu.exact: no implementation named {name!r}; the implementations are {', '.join(names())}")
    return _REGISTRY[name]


def select(device: torch.device) -> Implementation:
    """The implementation for tensors on `device`: a forced one if any, else the device's default."""
    if _forced:
        return get(_forced[-1])
    for name in _DEFAULTS_FOR_DEVICE.get("cuda" if on_device(device) else device.type, []):
        if get(name).runs_on(device):
            return get(name)
    raise ValueError(
        f"sexpgpu.exact: no implementation runs on {device.type} tensors; "
        f"use tensors on {' or '.join(sorted(_DEFAULTS_FOR_DEVICE))}"
    )


def forcing() -> bool:
    """Whether some implementation is forced (then det_gemm, too, adds every product)."""
    return bool(_forced)


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
# A default registered later comes first: int8 tensor cores where the GPU has them, else
# the Triton kernel; wide fp64 slices on CPU. "int8" on CPU multiplies its int8 slices in
# fp64: the tensor cores' arithmetic, checked bit for bit without a GPU.
register(Implementation("bins", ("cpu",), ".bins_kernel"))
register(Implementation("sliced", ("cpu", "cuda"), ".sliced_kernel"))
register(Implementation("triton", ("cuda",), ".triton_kernel"), default_on=("cuda",))
register(Implementation("int8", ("cuda", "cpu"), ".block_slices", "accumulate_int8", requires="int8 tensor cores"),
         default_on=("cuda",))
register(Implementation("fp64", ("cpu", "cuda"), ".block_slices", "accumulate_fp64"), default_on=("cpu",))
