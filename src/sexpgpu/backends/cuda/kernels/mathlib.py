"""Where a generated kernel's math functions come from.

The bits of exp, log, tanh, erf and the draws must be the CPU interpreter's, so their bodies
come from the portable numerics library: `sexpgpu.numerics.triton` is expected to hold
`@triton.jit` device functions of one float32 argument with these names. Until a function is
there, the kernel takes it from `fallback_math` (the CUDA libdevice, or Triton's own math in
interpreter mode), and `missing()` names it so the backend's facts can say so.
"""

from __future__ import annotations

import importlib

NUMERICS_MODULE = "sexpgpu.numerics.triton"
FALLBACK_MODULE = "sexpgpu.backends.cuda.kernels.fallback_math"
FUNCTIONS = ("exp", "log", "tanh", "erf", "sigmoid", "rsqrt", "pow")
DRAWS = ("uniform", "normal", "bernoulli", "randint", "truncated_normal")


def _numerics():
    try:
        return importlib.import_module(NUMERICS_MODULE)
    except ImportError:
        return None


def provider(name: str) -> str:
    """The module a kernel imports function `name` from."""
    module = _numerics()
    if module is not None and hasattr(module, name):
        return NUMERICS_MODULE
    return FALLBACK_MODULE


def import_line(name: str) -> str:
    return f"from {provider(name)} import {name} as m_{name}"


def missing() -> list[str]:
    """The math functions and draws that do not come from the numerics library yet."""
    module = _numerics()
    return [name for name in FUNCTIONS + DRAWS if module is None or not hasattr(module, name)]
