"""Composite ops written out as their decompositions (OpDef.decompose in graph/core/ops.py).

    decomposed(graph, which) -> graph with each node `which(node)` picks written as its formula
    composed_attention(graph) -> graph with each float32 attention op written out

A backend that fuses only some composite ops runs the rest decomposed, and the exact modes of
both backends sum `composed_attention`'s graph exactly (their float32 arithmetic fuses
attention instead). Only float32 attention is composed: a bf16 attention op rounds inside its
products in ways its own kernels follow (backends/cpu/op_kernels.py), so it keeps its op.

Nodes a decomposition makes for one node may be shared with another's (Emitter.once: an
attention's probabilities serve its output and both cotangents); every node is a function of
its inputs, so sharing changes no bit. Decompositions are written out one level: a formula's
own composite ops (attention's softmax) stay as they are.
"""

from __future__ import annotations

from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ir import Graph, Node
from sexpgpu.graph.core.ops import OPS

ATTENTION_OPS = ("attention_core", "attention_grad_q", "attention_grad_kv")


def decomposed(graph: Graph, which) -> Graph:
    """`graph` with every node that `which(node)` picks written out as its op's decomposition;
    the same graph when it picks none."""
    if not any(which(node) for node in graph.nodes):
        return graph
    e = Emitter()
    mapped: dict = {}
    for node in graph.nodes:
        inputs = tuple(mapped[id(source)] for source in node.inputs)
        with e.at(node.name, node.loc):
            if which(node):
                mapped[id(node)] = OPS[node.op].decompose(e, node.attrs, *inputs)
            elif all(new is old for new, old in zip(inputs, node.inputs)):
                e.nodes.append(node)
                mapped[id(node)] = node
            else:
                mapped[id(node)] = e(node.op, *inputs, **node.attrs)
    outputs = {name: mapped[id(node)] for name, node in graph.outputs.items()}
    return e.graph(dict(graph.inputs), outputs)


def _float32_attention(node: Node) -> bool:
    return node.op in ATTENTION_OPS and node.dtype == "f32"


def composed_attention(graph: Graph) -> Graph:
    return decomposed(graph, _float32_attention)
