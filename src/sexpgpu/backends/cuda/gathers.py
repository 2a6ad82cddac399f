"""Gathers and their scatters: rows of a table picked by index (PyTorch's index_select), and
the sums of rows into their places (codegen/scatter.py's kernel, in a fixed order)."""

from __future__ import annotations

from sexpgpu.graph.core.rules import RuleTable

GATHERS = RuleTable("cuda gathers", needs=lambda op: op.name in ("gather", "scatter_add"))


@GATHERS.rule("gather")
def gather(lowerer, node) -> None:
    import torch

    row_shape = tuple(node.inputs[0].shape[1:])

    def write(out, rows, index):
        torch.index_select(rows, 0, index.reshape(-1), out=out.view((-1,) + row_shape))

    lowerer.emit_torch(node, "gather", write)


@GATHERS.rule("scatter_add")
def scatter_add(lowerer, node) -> None:
    from sexpgpu.backends.cuda.codegen.scatter import scatter_add as scatter

    lowerer.emit_torch(node, "scatter", lambda out, index, source: scatter(index, source.contiguous(), out))
