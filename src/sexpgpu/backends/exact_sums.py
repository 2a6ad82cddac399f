"""The run loop's sums across backend calls under `:arithmetic exact`.

A step's gradient is one exact sum over all its records: each microbatch call (or stacked
call) returns its parameters' gradients as unrounded `Accumulator`s (graph/exact_region.py),
`add` combines them exactly, in any grouping, and `rounded` rounds each gradient once, into
float32, before the update graph reads it. So the stacking degree, and how calls are
grouped, change no bit. The step's loss and a pass's metrics average values that are
already rounded: `mean` is round(exact sum) / n in one IEEE float32 division.

Backends call this with their own storage: `to_backend` makes a float32 tensor, on the
accumulators' device, into what the backend's graphs read (a numpy array for the
interpreter; a device backend keeps the tensor where it is).
"""

from __future__ import annotations

import numpy as np
import torch

from sexpgpu.exact import det_combine, det_finalize, det_sum


class ExactSums:
    def __init__(self, to_backend):
        self.to_backend = to_backend

    @staticmethod
    def add(total: dict | None, grads: dict) -> dict:
        """{name: Accumulator}: total plus the call's gradients, exactly."""
        if total is None:
            return dict(grads)
        return {name: det_combine([total[name], grads[name]]) for name in total}

    def rounded(self, total: dict) -> dict:
        """Each gradient rounded once into float32, in the backend's storage."""
        return {name: self.to_backend(det_finalize(acc)) for name, acc in total.items()}

    @staticmethod
    def mean(values: list) -> np.float32:
        """round(exact sum of the float32 values) / len(values), one float32 division."""
        terms = torch.tensor(np.asarray(values, dtype=np.float32).reshape(-1))
        return np.float32(np.float32(det_sum(terms, 0).item()) / np.float32(terms.numel()))

