"""Which backend runs a program: `--device auto|cpu|cuda`.

`auto` takes the GPU when one is usable and the CPU interpreter otherwise. Each backend
states the facts its lowering report ends with: its determinism level and its choices.

Under `:arithmetic exact` the graphs say what is exact (graph/passes/exact_region.py) and
both backends compute them with the same bits: `auto` takes the GPU when one is usable, as
for any run, and `run_facts` gives either the exact level and no choices.
"""

from __future__ import annotations

from sexpgpu.backends.cpu import Interpreter
from sexpgpu.backends.cpu.facts import CPU_CHOICES
from sexpgpu.errors import SexpgpuError
from sexpgpu.plan.levels import How, determinism_line

DEVICES = ("auto", "cpu", "cuda")


# an exact run's closing lines, whichever backend computes it: nothing is left to choose
EXACT_FACTS = {"determinism": determinism_line(How("exact"), ""), "choices": CPU_CHOICES["exact"]}


def run_facts(facts: dict, arithmetic: str) -> dict:
    """A backend's facts as a run of `:arithmetic` states them: an exact run's level and choices are EXACT_FACTS."""
    return {**facts, **EXACT_FACTS} if arithmetic == "exact" else facts


def cuda_problem() -> str | None:
    """Why the CUDA backend cannot run here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install torch with CUDA support)"
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return f"this torch ({torch.__version__}) was built without CUDA"
        return "no CUDA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 0):
        name = torch.cuda.get_device_name()
        return f"the GPU {name} has compute capability {major}.{minor}; sexpgpu needs 8.0 or newer"
    try:
        import sexpgpu.backends.cuda.backend  # noqa: F401
    except ImportError as error:
        return f"the CUDA backend cannot be loaded: {error}"
    return None


def select_backend(device: str, gpu: int | None = None):
    """(backend, facts) for a device name; `gpu` is the index of
    the GPU a CUDA backend computes on (one process of several each has its own), else the
    current one."""
    if device not in DEVICES:
        raise SexpgpuError("E-CLI-002", f"unknown device '{device}': expected one of {', '.join(DEVICES)}.")
    if device == "cuda" or (device == "auto" and cuda_problem() is None):
        problem = cuda_problem()
        if problem is not None:
            raise SexpgpuError("E-DEVICE-001", f"--device cuda cannot run: {problem}.",
                               hint="Use --device cpu to run on the CPU interpreter.")
        from sexpgpu.backends.cuda.backend import CudaBackend

        backend = CudaBackend(device=None if gpu is None else f"cuda:{gpu}")
        return backend, {"kind": "cuda", **backend.facts()}
    backend = Interpreter()
    return backend, backend.facts()
