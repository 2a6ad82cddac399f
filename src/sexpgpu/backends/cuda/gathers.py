"""Gathers and their scatters: rows of a table picked by index (PyTorch's index_select), and
the sums of rows into their places (codegen/scatter.py's kernel, in a fixed order)."""

from __future__ import annotations

from sexpgpu.backends.cuda.launches import TorchLaunch, strided
from sexpgpu.graph.core.rules import RuleTable

GATHERS = RuleTable("cuda gathers", needs=lambda op: op.name in ("gather", "scatter_add"))


@GATHERS.rule("gather")
def gather(lowerer, node) -> None:
    import torch

    table, ids = node.inputs
    rows, rows_view = lowerer.addressable(table)
    index, index_view = lowerer.addressable(ids)
    key = lowerer.result_buffer(node)
    row_shape = tuple(table.shape[1:])

    def run(env):
        picked = strided(env, index, index_view).reshape(-1)
        torch.index_select(strided(env, rows, rows_view), 0, picked, out=env[key].view((-1,) + row_shape))

    lowerer.emit_result(node, TorchLaunch(run, (rows, index), (key,), "gather"))


@GATHERS.rule("scatter_add")
def scatter_add(lowerer, node) -> None:
    from sexpgpu.backends.cuda.codegen.scatter import scatter_add as scatter

    ids, values = node.inputs
    index, index_view = lowerer.addressable(ids)
    source, source_view = lowerer.addressable(values)
    key = lowerer.result_buffer(node)

    def run(env):
        scatter(strided(env, index, index_view), strided(env, source, source_view).contiguous(), env[key])

    lowerer.emit_result(node, TorchLaunch(run, (index, source), (key,), "scatter"))
