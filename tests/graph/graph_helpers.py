"""Shared helpers for the graph-stage tests: experiments from text, and IR graphs of expressions."""

from __future__ import annotations

from sexpgpu.graph.core.emit import Emitter
from sexpgpu.lang.forms import parse_experiment, select_run
from sexpgpu.lang.reader import read_text

NAME = "test.sexp"


def experiment(text: str, selection: str | None = None):
    """A checked Experiment from file text (named test.sexp in locations)."""
    return select_run(parse_experiment(read_text(text, NAME), NAME, ""), selection)


def expression_graph(text: str, inputs: dict, options: dict | None = None):
    """The graph of one body expression over inputs {name: (shape, dtype)}, output "y"."""
    from sexpgpu.graph.frontend.build import Builder, Frame

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
