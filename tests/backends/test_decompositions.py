"""The interpreter's fused kernels for composite ops are overrides of the ops' decompositions
(OpDef.decompose, graph/core/ops.py): on random graphs (tests/cuda/random_graphs.py, whose
seeds put each op first in turn), the graph and the graph with that op's nodes written out
(graph/passes/decomposed.py) give the same bits, since each kernel follows its formula step
for step. A kernel computes a bf16 node in float32 and rounds its result once, so a bf16
node's formula is compared computed that way: its operands widened to float32, its result
cast to bf16."""

from __future__ import annotations

import sys
from pathlib import Path

from dataclasses import replace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))

from random_graphs import OP_NAMES, graph_from_seed  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.graph.core.ops import OPS  # noqa: E402
from sexpgpu.graph.passes.decomposed import decomposed  # noqa: E402

CPU = Interpreter()
COMPOSITE = sorted(name for name, op in OPS.items() if op.decompose is not None)
SAMPLES = 12  # random graphs an op


def test_the_composite_ops_are_written_once_as_decompositions():
    assert COMPOSITE == sorted(["attention_core", "attention_grad_q", "attention_grad_kv", "cross_entropy",
                                "layernorm", "log_softmax", "softmax"])


def widened(formula):
    """`formula` in float32 on bf16 operands, its result rounded once to bf16."""
    def decompose(e, attrs, *inputs):
        if not any(node.dtype == "bf16" for node in inputs):
            return formula(e, attrs, *inputs)
        wide = [e("cast", node, dtype="f32") if node.dtype == "bf16" else node for node in inputs]
        return e("cast", formula(e, attrs, *wide), dtype="bf16")

    return decompose


@pytest.mark.parametrize("op", COMPOSITE)
def test_each_fused_kernel_gives_the_bits_of_its_decomposition(op, monkeypatch):
    monkeypatch.setitem(OPS, op, replace(OPS[op], decompose=widened(OPS[op].decompose)))
    in_bf16 = 0
    for sample_index in range(SAMPLES):
        sample = graph_from_seed(OP_NAMES.index(op) + sample_index * len(OP_NAMES))
        written = decomposed(sample.graph, lambda node: node.op == op)
        assert op in sample.ops and op not in written.op_counts()
        want, got = CPU.run(sample.graph, sample.values), CPU.run(written, sample.values)
        for name, value in want.items():
            assert got[name].tobytes() == value.tobytes(), f"seed {sample.seed}: {name}"
        in_bf16 += sample.loose
    assert in_bf16 > 0 or op.startswith("attention")  # random_graphs gives attention float32 operands
