"""The CPU interpreter's lines of the lowering report: its name, level and choices."""

from __future__ import annotations

import platform

import numpy as np

from sexpgpu.plan.levels import How, determinism_line

CPU_CHOICES = {
    "float": "none: stacking 1, sequential folds in a documented order, portable float32 math",
    "exact": "none: every sum exact and rounded once, so no stacking degree or GPU count changes a bit; "
             "portable float32 math",
}


def cpu_facts() -> dict:
    return {
        "kind": "cpu",
        "name": f"cpu interpreter (numpy {np.__version__}, {platform.machine() or 'unknown machine'})",
        "determinism": determinism_line(How("interpreter"), ""),
        "choices": CPU_CHOICES["float"],
    }
