"""Learning-rate schedules, computed identically on every machine.

The value for step s (1-based) is formed in float64 from IEEE + - * / and the portable
float32 cosine, then rounded once to float32, so no platform math library is involved.
"""

from __future__ import annotations

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
    decay_steps = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    cosine = float(nx.cos(np.array([_PI * progress], dtype=np.float32))[0])
    return np.float32(schedule.min_lr + 0.5 * (base_lr - schedule.min_lr) * (1.0 + cosine))
