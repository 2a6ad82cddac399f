"""The contract every backend meets, and the input checks they share.

The run loop, the plan, the store and the tools drive a backend only through `Backend`, and
never ask a backend what it is (no getattr, no test of its name). A backend executes what the
plan decided (plan/choices.py); whatever it needs to know of those decisions it is handed
(`take_choices`), never left to find out for itself. `BackendDefaults` gives the members a
backend with nothing to do implements as nothing: both backends inherit it.

A graph's inputs are checked the same way on every backend, here: the names must be the
graph's own, and a host value must already have the input's kind (floats for f32 and bf16,
integers in range for i32, booleans for bool). A backend adds only what is its own: the
storage it converts to, and when it checks bf16 values.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from sexpgpu.plan.device import DeviceProbe
from sexpgpu.plan.memory import plan_memory

INT32_RANGE = (-(2**31), 2**31)


@runtime_checkable
class Backend(Protocol):
    """What a backend offers the rest of SexpGPU."""

    name: str  # "cpu", "cuda": the device kind a report and a checkpoint name
    # whether the plan decides for it (a stacking degree, a recompute budget, products'
    # implementations, convolutions' engines), measured with its probe or by fixed rules
    # without one; False: it runs unstacked and decides nothing (the CPU interpreter)
    takes_choices: bool

    def run(self, graph, inputs: dict, lent: bool = False) -> dict:
        """The graph's outputs by name, from `inputs` by name (exactly the graph's inputs).
        `lent`: the caller takes outputs that may be the backend's own buffers, valid until
        the next run of the same graph, and neither writes to them nor keeps them past it;
        a backend may ignore it and return values of their own."""

    def cast_parameter(self, array: np.ndarray, dtype: str):
        """A parameter's starting value in this backend's storage for `dtype`."""

    def to_host(self, value) -> np.ndarray:
        """A value this backend returned, as a host array."""

    def from_host(self, array: np.ndarray):
        """A host array in this backend's storage."""

    def fingerprints(self, values: list) -> list[int]:
        """A 64-bit fingerprint of each value's bits, computed where the values live; equal
        bits give equal fingerprints on every backend (run/digest.py)."""

    def facts(self) -> dict:
        """The lowering report's lines about the device: its `name`, and the `determinism` and
        `choices` a run that chooses here states (`sexpgpu check` prints them)."""

    def probe(self) -> DeviceProbe | None:
        """What the plan asks this device before it decides (plan/device.py): its facts, free
        memory and timings; None where its room is the host's (plan/fit.py)."""

    def take_choices(self, choices) -> None:
        """Execute from now on what the plan decided (plan/choices.py's Choices)."""

    def memory_peak(self, graph) -> int:
        """Bytes a run of `graph` holds at its peak on this backend."""

    def release(self, graph) -> None:
        """Let go of the memory held for `graph`; a later run of it allocates it again (the run
        loop going on unstacked after a stacked call found the memory full)."""


class BackendDefaults:
    """The contract's members for a backend that has nothing of its own to do there."""

    takes_choices = False

    def probe(self) -> DeviceProbe | None:
        return None

    def take_choices(self, choices) -> None:
        """Nothing to execute: the plan decides nothing for this backend."""

    def memory_peak(self, graph) -> int:
        """The graph's own memory plan (plan/memory.py)."""
        return plan_memory(graph).peak_bytes

    def release(self, graph) -> None:
        """Nothing is held between runs."""


def check_input_names(graph, inputs: dict) -> None:
    """A graph is run with exactly its inputs: a missing or a foreign name is a caller's bug."""
    missing = [name for name in graph.inputs if name not in inputs]
    extra = [name for name in inputs if name not in graph.inputs]
    if missing or extra:
        raise ValueError(f"graph inputs: missing {missing}, not inputs of this graph {extra}")


def check_input_shape(name: str, node, shape) -> None:
    if tuple(shape) != tuple(node.shape):
        raise ValueError(f"input {name}: shape {tuple(shape)}, the graph expects {node.shape}")


def host_input(name: str, node, value, float_types=(np.float32,)) -> np.ndarray:
    """A host value for an input node as an array of the node's kind: a Python number or an
    array of one of `float_types` for f32 and bf16, integers within int32 for i32 (made
    int32), booleans for bool. Its shape is checked by the caller."""
    if node.dtype in ("f32", "bf16"):
        if isinstance(value, (float, int)) and not isinstance(value, bool):
            return np.asarray(value, dtype=float_types[0])
        array = np.asarray(value)
        if array.dtype.type not in float_types:
            raise TypeError(f"input {name}: {array.dtype} array for a {node.dtype} input; pass float32")
        return array
    array = np.asarray(value)
    if node.dtype == "i32":
        if not np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
            raise TypeError(f"input {name}: {array.dtype} for an i32 input; pass integers")
        if array.size and (array.min() < INT32_RANGE[0] or array.max() >= INT32_RANGE[1]):
            raise ValueError(f"input {name}: values outside the int32 range")
        return array.astype(np.int32, copy=False)
    if array.dtype != np.bool_:
        raise TypeError(f"input {name}: {array.dtype} for a bool input")
    return array
