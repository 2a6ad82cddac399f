"""Acc values (graph/core/ops.py, "Exact arithmetic") as backends hold them, and what is done with them.

An acc value is an exact sum not rounded yet: an `Accumulator` of digits (sexpgpu.exact), or
a `PendingSum`, the sum's operands, its digits formed only when something adds to it. A step
of one call (unstacked with one microbatch, or stacked over all of them) then rounds each
gradient straight from its operands by the exact library's fast paths, the same bits as
rounding the digits, and never forms them. `accumulated` forms them, `rounded_once` rounds
either once; `summed_over_processes` is the sum across processes (distributed/world.py).

A step adds its calls' gradients and rounds them with graphs of acc values alone
(graph/passes/exact_region.py's GradientSums): the CPU interpreter runs them as any graph; a
device backend runs them here (`evaluated`), on whatever device the digits lie. So the
stacking degree, and how calls are grouped, change no bit. The step's loss and a pass's
metrics average values that are already rounded: `mean` is round(exact sum) / n.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from sexpgpu.backends.exact_ops import TORCH_DTYPES
from sexpgpu.exact import Accumulator, det_all_reduce, det_combine, det_finalize, det_sum
from sexpgpu.graph.core.ops import ACC
from sexpgpu.graph.core.rules import RuleTable


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


def rounded_once(value, dtype: str = "f32") -> torch.Tensor:
    """An acc value rounded once into `dtype` ("f32" or "bf16"); a PendingSum's float32 by its fast path."""
    if isinstance(value, PendingSum) and dtype == "f32":
        return value.rounded()
    return det_finalize(accumulated(value), TORCH_DTYPES[dtype])


def mean(values: list) -> np.float32:
    """An exact run's loss or metric over calls: round(exact sum of the float32 values) /
    len(values), one float32 division."""
    terms = torch.tensor(np.asarray(values, dtype=np.float32).reshape(-1))
    return np.float32(np.float32(det_sum(terms, 0).item()) / np.float32(terms.numel()))


# --- graphs of acc values alone, on the host ----------------------------------------------------

# a step's sums across its calls (graph/passes/exact_region.py's GradientSums): digits added and
# rounded by the exact library wherever the acc values lie; a device backend runs these here
HOST_RULES = RuleTable("acc graphs on the host", needs=lambda op: op.name in ("add", "round"))
HOST_RULES.add("add", lambda node, args: det_combine([accumulated(arg) for arg in args]))  # one shape: no broadcast
HOST_RULES.add("round", lambda node, args: rounded_once(args[0], node.dtype))


def on_host(graph) -> bool:
    """Whether every node of `graph` is an acc input or has a rule of HOST_RULES."""
    return all(node.op in HOST_RULES or (node.op == "input" and node.dtype == ACC) for node in graph.nodes)


def evaluated(graph, inputs: dict) -> dict:
    """The outputs of an `on_host` graph."""
    values = {node: inputs[name] for name, node in graph.inputs.items()}
    for node in graph.nodes:
        if node not in values:
            values[node] = HOST_RULES[node.op](node, [values[source] for source in node.inputs])
    return {name: values[node] for name, node in graph.outputs.items()}
