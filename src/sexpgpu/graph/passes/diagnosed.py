"""The diagnosed graph: a microbatch graph that also outputs each layer's activation; and the
traced graph: its forward part with every floating-point value kept.

A layer is a scope (`Node.name`, what `:as` names, such as `fc1` or `block0/attn`); its
activation is the last floating-point node of that scope in the forward part, before the
loss. The diagnosed graph has the same nodes in the same order, so the interpreter computes
the same bits; a backend that fuses may lower it otherwise, since its activations must now
be kept (docs/tools.md, "Diagnostics").
"""

from __future__ import annotations

from sexpgpu.graph.core.ir import FLOAT_DTYPES, Graph, make_graph

ACTIVATION = "act/"
TRACED = "traced/"


def layer_activations(micro: Graph) -> dict:
    """{scope: node} of the forward part, in graph order."""
    loss = micro.outputs["loss"]
    found: dict = {}
    for node in micro.nodes:
        if node is loss:
            break
        if node.op != "input" and node.name and node.dtype in FLOAT_DTYPES:
            found[node.name] = node  # the last one of the scope wins
    return found


def diagnosed_graph(micro: Graph) -> Graph:
    """`micro` with an `act/<scope>` output for each layer."""
    extra = {ACTIVATION + scope: node for scope, node in layer_activations(micro).items()}
    return Graph(dict(micro.inputs), {**micro.outputs, **extra}, micro.nodes)


def traced_graph(micro: Graph) -> Graph:
    """`micro`'s forward part, up to its loss, with every floating-point value it computes as an
    output `traced/<position in micro>`, in graph order: what a loss that is not finite is
    traced back through (run/nonfinite.py). The backward part is left out: the loss needs none of it."""
    loss = micro.outputs["loss"]
    end = next(index for index, node in enumerate(micro.nodes) if node is loss)
    outputs = {f"{TRACED}{index}": node for index, node in enumerate(micro.nodes[:end + 1])
               if node.op != "input" and node.dtype in FLOAT_DTYPES}
    return make_graph(micro.inputs, outputs, list(micro.nodes))
