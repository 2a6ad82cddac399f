"""Gathers and their scatters: rows of a table picked by index (PyTorch's index_select), and
the sums of rows into their places (codegen/scatter.py's kernel, in a fixed order)."""

from __future__ import annotations

from sexpgpu.backends.cuda.launches import TorchLaunch, reads_of
from sexpgpu.graph.core.rules import RuleTable

GATHERS = RuleTable("cuda gathers", needs=lambda op: op.name in ("gather", "scatter_add"))


@GATHERS.rule("gather")
def gather(lowerer, node) -> None:
    import torch

    rows, index = operands = lowerer.operands(node.inputs)
    key = lowerer.result_buffer(node)
    row_shape = tuple(node.inputs[0].shape[1:])

    def run(env):
        torch.index_select(rows.strided(env), 0, index.strided(env).reshape(-1), out=env[key].view((-1,) + row_shape))

    lowerer.emit_result(node, TorchLaunch(run, reads_of(operands), (key,), "gather"))


@GATHERS.rule("scatter_add")
def scatter_add(lowerer, node) -> None:
    from sexpgpu.backends.cuda.codegen.scatter import scatter_add as scatter

    index, source = operands = lowerer.operands(node.inputs)
    key = lowerer.result_buffer(node)

    def run(env):
        scatter(index.strided(env), source.strided(env).contiguous(), env[key])

    lowerer.emit_result(node, TorchLaunch(run, reads_of(operands), (key,), "scatter"))
