"""Where a generated kernel's math functions come from: the portable numerics library
(portable_math.py), so that their bits are the CPU interpreter's."""

from __future__ import annotations

MODULE = "sexpgpu.backends.cuda.codegen.portable_math"
FUNCTIONS = ("exp", "log", "tanh", "erf", "sigmoid", "rsqrt", "pow")


def import_line(name: str) -> str:
    return f"from {MODULE} import {name} as m_{name}"
