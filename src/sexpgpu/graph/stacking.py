"""Stacking k microbatches of a step as one batch (determinism.md, "What a run chooses").

A placeholder until the stacking mechanism lands (branch h-stacking replaces this file): it
offers the unstacked training graph only. plan/choices.py decides the degree; a device whose
probe offers no degree above 1 never asks for another.
"""

from __future__ import annotations


def stack_training(training, degree: int):
    """The training graph with `degree` microbatches stacked as one batch."""
    if degree != 1:
        raise NotImplementedError(f"stacking {degree} microbatches is not built yet")
    return training
