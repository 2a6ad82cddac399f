"""Composite ops written out as their decompositions (OpDef.decompose in graph/core/ops.py).

    decomposed(graph, which) -> graph with each node `which(node)` picks written as its formula
    composed_attention(graph) -> graph with each float32 attention op written out

A backend runs a composite op it has no kernel for decomposed; the exact modes of both
backends sum `composed_attention`'s graph exactly. A bf16 attention op rounds inside its
products as its own kernels do (backends/cpu/op_kernels.py), so it keeps its op. Nodes a
decomposition makes may be shared between nodes (Emitter.once), which changes no bit. One
level is written out: a formula's own composite ops (attention's softmax) stay.
"""

from __future__ import annotations

from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ir import Graph
from sexpgpu.graph.core.ops import OPS


def decomposed(graph: Graph, which) -> Graph:
    """`graph` with every node that `which(node)` picks written out as its op's decomposition;
    the same graph when it picks none."""
    if not any(which(node) for node in graph.nodes):
        return graph
    e = Emitter()
    mapped = e.rewrite(graph.nodes, lambda e, node, inputs: OPS[node.op].decompose(e, node.attrs, *inputs)
                       if which(node) else None)
    outputs = {name: mapped[id(node)] for name, node in graph.outputs.items()}
    return e.graph(dict(graph.inputs), outputs)


def composed_attention(graph: Graph) -> Graph:
    return decomposed(graph, lambda node: OPS[node.op].kind == "attention" and node.dtype == "f32")
