"""Shared helpers for the graph-stage tests: experiments from text, and IR graphs by hand."""

from __future__ import annotations

import numpy as np

from sexpgpu.graph.emit import Emitter
from sexpgpu.lang.forms import parse_experiment, select_run
from sexpgpu.lang.reader import read_text

NAME = "test.sexp"


def experiment(text: str, selection: str | None = None):
    """A checked Experiment from file text (named test.sexp in locations)."""
    return select_run(parse_experiment(read_text(text, NAME), NAME, ""), selection)


def single_op_graph(op: str, specs: list, attrs: dict, seed: int = 0):
    """A graph `y = op(inputs)` with random inputs per `specs` [(dtype, shape, kind)].

    kind: "normal", "positive", "spread" (distinct, well separated values), "labels:N",
    "bool". Returns (emitter, input nodes, output node, input arrays (float64 for floats)).
    """
    rng = np.random.default_rng(seed)
    e = Emitter()
    nodes, arrays = [], []
    for index, (dtype, shape, kind) in enumerate(specs):
        nodes.append(e.input(f"x{index}", dtype, shape))
        arrays.append(_array(rng, dtype, shape, kind))
    return e, nodes, e(op, *nodes, **attrs), arrays


def _array(rng, dtype: str, shape: tuple, kind: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if kind.startswith("labels:"):
        return rng.integers(0, int(kind.split(":")[1]), shape).astype(np.int32)
    count = int(np.prod(shape, dtype=np.int64))
    if kind == "positive":
        values = rng.uniform(0.5, 2.0, count)
    elif kind == "spread":
        values = rng.permutation(count) * 0.37 - count * 0.15 + rng.uniform(-0.05, 0.05, count)
    else:
        values = rng.standard_normal(count)
    return values.reshape(shape)


def expression_graph(text: str, inputs: dict, options: dict | None = None):
    """The graph of one body expression over inputs {name: (shape, dtype)}, output "y"."""
    from sexpgpu.graph.build import Builder, Frame

    e = Emitter()
    builder = Builder(e, {}, seed=0, batch=1, mode="model")
    env = dict(options or {})
    nodes = {name: e.input(name, dtype, shape) for name, (shape, dtype) in inputs.items()}
    env.update(nodes)
    (expression,) = read_text(text, NAME)
    y = builder.evaluate(expression, Frame(env, "", "test"))
    nodes.update({f"param/{path}": node for path, node in builder.param_nodes.items()})
    nodes.update(builder.scalar_nodes)
    return e.graph(nodes, {"y": y})
