"""Graphs of draws for the CUDA backend's tests: every draw op under every kind of salt (none,
the step, the microbatch, the trip, a scalar computed on the device, per-record fields, and
more salts than one key kernel folds), 0-d, odd and large shapes, and stacked draws; with the
bits each must give, computed here from numerics' own draws (not through the interpreter).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sexpgpu import numerics as nx
from sexpgpu.graph.core.emit import Emitter

SEED = 20261203
ROWS = 5  # records in the batch: each field salt holds one integer per record
PARAMS = {"normal": {"mean": 0.5, "std": 2.0}, "uniform": {"low": -1.0, "high": 3.0},
          "truncated_normal": {"mean": 0.0, "std": 1.0, "bound": 1.5}, "bernoulli": {"p": 0.3},
          "randint": {"low": -4, "high": 7}}
SCALARS = ("step", "microbatch", "trip")
FIELDS = {"field/id": [4, -1, 2**31 - 1, -(2**31), 9], "field/other": [0, 1, 1, 7, -3]}
COMPUTED = "computed"  # argmax(x) - 3 step: a scalar salt no caller gives, made by kernels


class DrawCase(NamedTuple):
    op: str
    shape: tuple
    salts: tuple  # salt kinds, folded in this order: SCALARS, COMPUTED or a name of FIELDS
    repeats: int = 1  # a stacked draw's repeats along its first axis

    @property
    def name(self) -> str:
        return f"{self.op} {self.shape} {'+'.join(self.salts) or 'unsalted'} x{self.repeats}"


# the fold kernel sees the salts and the draw kernel the shape: each op meets every salt kind
# at one shape and every shape under one salt
SALTS = [(), ("microbatch",), ("trip",), (COMPUTED,), ("trip", "step"), ("step", "microbatch", "trip", COMPUTED, "step")]
PER_ROW = [("field/id",), ("step", "field/id", "trip"), ("field/id", COMPUTED, "field/other")]
STACKED = [(), ("step", "trip")]


def cases(shapes, row_shapes, stacked_shapes, ops=tuple(PARAMS)) -> list[DrawCase]:
    """Each op: each of `shapes` salted by the step, the first under every other salt of
    SALTS; per-row salts (PER_ROW) with rows of the first of `row_shapes`, the first of them
    with each other; a stacked draw of each (repeats, shape) of `stacked_shapes`, in turn
    unsalted and salted."""
    found = []
    for op in ops:
        found += [DrawCase(op, shape, ("step",)) for shape in shapes]
        found += [DrawCase(op, shapes[0], salts) for salts in SALTS]
        found += [DrawCase(op, (ROWS,) + row_shapes[0], salts) for salts in PER_ROW]
        found += [DrawCase(op, (ROWS,) + row, PER_ROW[0]) for row in row_shapes[1:]]
        found += [DrawCase(op, shape, STACKED[index % 2], repeats)
                  for index, (repeats, shape) in enumerate(stacked_shapes)]
    return found


def draw_graph(draws: list[DrawCase]):
    """One graph drawing every case, each an output named by the case."""
    e = Emitter()
    inputs = {name: e.input(name, "i32", ()) for name in SCALARS}
    inputs.update({name: e.input(name, "i32", (ROWS,)) for name in FIELDS})
    inputs["x"] = e.input("x", "f32", (6,))
    step = inputs["step"]
    salts = dict(inputs, **{COMPUTED: e("sub", e("argmax", inputs["x"], axis=0), e("mul", step, e.const(3, like=step)))})
    outputs = {}
    for case in draws:
        attrs = dict(PARAMS[case.op], shape=case.shape, seed=SEED, stream=f"draws/{case.name}", salts=case.salts)
        if case.repeats != 1:
            attrs["repeats"] = case.repeats
        outputs[case.name] = e(case.op, *[salts[kind] for kind in case.salts], **attrs)
    return e.graph(inputs, outputs)


def draw_inputs(step: int, microbatch: int = 2, trip: int = 1) -> dict:
    x = np.zeros(6, dtype=np.float32)
    x[step % 6] = 1.0
    values = {"step": np.int32(step), "microbatch": np.int32(microbatch), "trip": np.int32(trip), "x": x}
    return dict(values, **{name: np.array(ids, dtype=np.int32) for name, ids in FIELDS.items()})


def salt_values(inputs: dict) -> dict:
    values = {name: inputs[name] for name in SCALARS + tuple(FIELDS)}
    return dict(values, **{COMPUTED: int(np.argmax(inputs["x"])) - 3 * int(inputs["step"])})


def expected(case: DrawCase, inputs: dict) -> np.ndarray:
    """The case's draw, from numerics' draws: each salt folded in with fold_in, a row per
    record under a field salt, a stacked draw's block repeated."""
    key = nx.stream_key(SEED, f"draws/{case.name}")
    values = [salt_values(inputs)[kind] for kind in case.salts]
    params = PARAMS[case.op]
    if any(np.ndim(value) for value in values):
        rows = [_folded(key, [value[r] if np.ndim(value) else value for value in values]) for r in range(ROWS)]
        return np.stack([nx.draw(case.op, row, case.shape[1:], **params) for row in rows])
    if case.repeats == 1:
        return nx.draw(case.op, _folded(key, values), case.shape, **params)
    block = (case.shape[0] // case.repeats,) + case.shape[1:]
    return np.concatenate([nx.draw(case.op, _folded(key, values), block, **params)] * case.repeats)


def _folded(key, values):
    for value in values:
        key = nx.fold_in(key, int(value))
    return key


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()
