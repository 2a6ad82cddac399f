"""Draw nodes on the device, inside the captured graph, with the interpreter's bits.

A draw's key is stream_key(seed, stream) with each salt folded in, in input order
(graph/core/ops.py, backends/cpu/draws.py). What is known when the graph is lowered, the stream
key and the distribution's parameters, becomes a constant buffer of the draw kernel's args
words (numerics.draw_args). The salts are device values: the step, the microbatch and the
trip are inputs, which a captured graph's static buffers hold, and any other salt is a value
its kernels computed. Each call folds them into the key on the device (numerics.fold_keys),
into an arena buffer of args words that the draw kernel then reads (numerics.draw_into).
So no draw does host work or reads the device back, the graph is captured like any other,
and a replay draws for the salts of its own call. The kernels are numerics' own, whose bits
are its numpy path's, which the interpreter calls: the same bits on both backends.

- A salt with one integer per record folds into one key per row: the args buffer has a row
  for each record, and row r of the draw is drawn under the r-th, with one row's shape.
- A stacked draw (attr `repeats`, graph/training/stacking.py) draws one microbatch's block and writes
  it `repeats` times, in the same kernel.
"""

from __future__ import annotations

from typing import NamedTuple

from sexpgpu import numerics as nx
from sexpgpu.backends.cuda.launches import TorchLaunch
from sexpgpu.graph.core.rules import RuleTable

DRAWS = RuleTable("cuda draws", needs=lambda op: op.kind == "draw")


class Layout(NamedTuple):
    """How numerics.draw_into lays a draw node's elements out."""

    rows: int  # keys: one a record for a salt read from a field, else 1
    copies: int  # the block's repeats in a stacked draw, else 1


def layout(node) -> Layout:
    per_row = any(source.rank == 1 for source in node.inputs)
    return Layout(node.shape[0] if per_row else 1, node.attrs.get("repeats", 1))


def spec(node) -> nx.DrawSpec:
    """The node's distribution with its parameters, checked as numerics checks them."""
    return nx.draw_spec(node.op, **{name: node.attrs[name] for name in nx.DRAW_PARAMETERS[node.op]})


@DRAWS.rule(*nx.DRAW_PARAMETERS)
def draw(lowerer, node) -> None:
    """A launch of one or two kernels: the salts folded into the args words (when the draw has
    salts), then the draw under them into the node's buffer."""
    distribution, places = spec(node), layout(node)
    words = nx.draw_args(nx.stream_key(node.attrs["seed"], node.attrs["stream"]), distribution)
    template = lowerer.constant_buffer("i64", (1, len(words)), words)
    salts = lowerer.operands(node.inputs)
    args = lowerer.new_buffer("i64", (places.rows, len(words))) if salts else template
    out = lowerer.result_buffer(node)

    def run(env):
        if salts:
            nx.fold_keys(env[template], [salt.strided(env) for salt in salts], env[args])
        nx.draw_into(distribution, env[out], env[args], places.rows, places.copies)

    lowerer.emit_result(node, TorchLaunch(run, (template,) + tuple(salt.key for salt in salts), (out, args) if salts else (out,), "draw"))
