"""The library settings that keep every sum in a fixed order, and the device facts that the
lowering report's choices line names.

`configure()` runs before the backend touches CUDA: cuBLAS gets a fixed workspace
(CUBLAS_WORKSPACE_CONFIG=:4096:8, read when its handle is made) and keeps its default of no
atomics; TF32 and reduced-precision reductions are off, so a float32 product is a pedantic
float32 GEMM; cuDNN may only use deterministic algorithms, and PyTorch refuses any
nondeterministic one (torch.use_deterministic_algorithms).
"""

from __future__ import annotations

import ctypes
import os

from sexpgpu.backends.cuda.fusion import FusionPolicy
from sexpgpu.plan.cache import cache_forgets
from sexpgpu.plan.device import patterns_text
from sexpgpu.plan.levels import How, determinism_line
from sexpgpu.backends.cuda.patterns import PATTERN_NAMES

CUBLAS_LIBRARIES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")


def configure() -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True)
    # every kernel writes each element it allocates; filling new memory with NaN first (the
    # deterministic mode's default) would only cost a pass over it
    torch.utils.deterministic.fill_uninitialized_memory = False


def cublas_version() -> str:
    """cuBLAS's version as major*10000 + minor*100 + patch, asked of the loaded library."""
    for name in CUBLAS_LIBRARIES:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        parts = []
        for kind in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            if library.cublasGetProperty(kind, ctypes.byref(value)) != 0:
                break
            parts.append(value.value)
        if len(parts) == 3:
            return str(parts[0] * 10000 + parts[1] * 100 + parts[2])
    return "unknown"


def device_facts(device) -> dict:
    """What the device decides: the facts two machines must share to lower alike."""
    import torch
    import triton

    if device.type != "cuda":
        return {"device": f"{device.type} (Triton interpreter)", "gpu": "none", "versions": f"Triton {triton.__version__}"}
    properties = torch.cuda.get_device_properties(device)
    torch.ones(1, 1, device=device) @ torch.ones(1, 1, device=device)  # loads cuBLAS
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else "none"
    return {
        "gpu": properties.name,
        "device": f"compute_{properties.major}{properties.minor} with {properties.multi_processor_count} multiprocessors",
        "versions": f"cuBLAS {cublas_version()}, cuDNN {cudnn}, Triton {triton.__version__}",
    }


def facts(device, policy: FusionPolicy) -> dict:
    import torch

    found = device_facts(device)
    return {
        "name": f"cuda {found['gpu']} (torch {torch.__version__}, SEXPGPU_OPTIMIZE={policy.level})",
        # what a run that chooses here would state (`sexpgpu check` prints it); a run states what happened
        "determinism": determinism_line(How("own", forgets=cache_forgets()), found["device"]),
        "choices": (
            f"stacking 1, recompute {policy.budget:.2f} flops a byte, 0 convolution engines; "
            f"on {found['device']}, {found['versions']}, patterns {patterns_text(policy.patterns, PATTERN_NAMES)}"
        ),
    }
