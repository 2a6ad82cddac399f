"""The run loop's sums across backend calls under `:arithmetic exact`.

A step's gradient is one exact sum over all its records: each microbatch call (or stacked
call) returns its parameters' gradients as unrounded `Accumulator`s (graph/passes/exact_region.py),
`add` combines them exactly, in any grouping, and `rounded` rounds each gradient once, into
float32, before the update graph reads it. So the stacking degree, and how calls are
grouped, change no bit. The step's loss and a pass's metrics average values that are
already rounded: `mean` is round(exact sum) / n in one IEEE float32 division.

Backends call this with their own storage: `to_backend` makes a float32 tensor, on the
accumulators' device, into what the backend's graphs read (a numpy array for the
interpreter; a device backend keeps the tensor where it is); `within` is the context the
backend computes its sums in (the CUDA backend run on CPU tensors takes the exact library's
device paths there, as in its graphs).

A backend may return a gradient as a `PendingSum` instead: the sum's operands, its digits
formed only when something adds to it. A step of one call (unstacked with one microbatch, or
stacked over all of them) then rounds each gradient straight from its operands by the exact
library's fast paths, the same bits as rounding the digits, and never forms them.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np
import torch

from sexpgpu.exact import Accumulator, det_all_reduce, det_combine, det_finalize, det_sum


class PendingSum:
    """An exact sum not formed yet: `digits()` forms it, `rounded()` gives its one rounding
    into float32 by a fast path. The backend that made it forms it (`accumulator`) before it
    runs the graph again, which would write over the operands the two read."""

    def __init__(self, digits: Callable[[], Accumulator], rounded: Callable[[], torch.Tensor], fixed: bool = False):
        self._digits, self._rounded = digits, rounded
        self._formed: Accumulator | None = None
        # fixed: its operands are the graph's own buffers as they lie, no copy, so a graph
        # whose buffers stay (a captured one) gives a sum over the same memory every call;
        # origin: where the backend says it came from, the same for such sums of every call
        self.fixed = fixed
        self.origin = None

    @property
    def formed(self) -> bool:
        return self._formed is not None

    def accumulator(self) -> Accumulator:
        if self._formed is None:
            self._formed = self._digits()
            self._digits = self._rounded = None  # the operands are let go
        return self._formed

    def rounded(self) -> torch.Tensor:
        return det_finalize(self._formed) if self._formed is not None else self._rounded()

    def moved(self, move_digits: Callable, move_values: Callable) -> "PendingSum":
        """The same sums reshaped or transposed: a move is exact on digits and on rounded values alike."""
        return PendingSum(lambda: move_digits(self.accumulator()), lambda: move_values(self.rounded()), self.fixed)


def accumulated(value) -> Accumulator:
    """A gradient's digits, formed now if it is a PendingSum."""
    return value.accumulator() if isinstance(value, PendingSum) else value


def summed_over_processes(value, group=None) -> Accumulator:
    """A gradient's exact sum over the processes of a torch.distributed group (the default
    one when None): its digits added as integers, whose sum no order or algorithm changes.
    The all-reduce works in place, on a copy: the digits may be a buffer the backend lent."""
    return det_all_reduce(Accumulator(accumulated(value).digits.clone()), group)


def rounded_once(value) -> torch.Tensor:
    return value.rounded() if isinstance(value, PendingSum) else det_finalize(value)


class ExactSums:
    def __init__(self, to_backend, within=contextlib.nullcontext):
        self.to_backend = to_backend
        self.within = within

    def add(self, total: dict | None, grads: dict) -> dict:
        """{name: Accumulator or PendingSum}: total plus the call's gradients, exactly."""
        if total is None:
            return dict(grads)
        with self.within():
            return {name: det_combine([accumulated(total[name]), accumulated(grads[name])]) for name in total}

    def rounded(self, total: dict) -> dict:
        """Each gradient rounded once into float32, in the backend's storage."""
        with self.within():
            return {name: self.to_backend(rounded_once(value)) for name, value in total.items()}

    @staticmethod
    def mean(values: list) -> np.float32:
        """round(exact sum of the float32 values) / len(values), one float32 division."""
        terms = torch.tensor(np.asarray(values, dtype=np.float32).reshape(-1))
        return np.float32(np.float32(det_sum(terms, 0).item()) / np.float32(terms.numel()))

