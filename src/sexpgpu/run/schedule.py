"""Learning-rate schedules, computed identically on every machine.

The value for step s (1-based) is formed in float64 from IEEE + - * / and the portable
float32 cosine, then rounded once to float32, so no platform math library is involved.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from sexpgpu import numerics as nx

_PI = 3.141592653589793


def learning_rate(schedule, base_lr: float, step: int, total_steps: int) -> np.float32:
    if schedule.kind == "constant":
        return np.float32(base_lr)
    warmup = schedule.warmup
    if warmup and step <= warmup:
        return np.float32(base_lr * (step / warmup))
    if schedule.kind == "warmup":
        return np.float32(base_lr)
    cosine = float(_cosines(warmup, total_steps)[min(step, total_steps) - warmup])
    return np.float32(schedule.min_lr + 0.5 * (base_lr - schedule.min_lr) * (1.0 + cosine))


@lru_cache(maxsize=8)
def _cosines(warmup: int, total_steps: int) -> np.ndarray:
    """cos(pi * progress) for steps warmup .. total_steps, in one portable call: the same
    elementwise bits as one call a step, without its fixed cost."""
    decay_steps = max(1, total_steps - warmup)
    progress = [(step - warmup) / decay_steps for step in range(warmup, total_steps + 1)]
    return nx.cos(np.array([_PI * p for p in progress], dtype=np.float32))
