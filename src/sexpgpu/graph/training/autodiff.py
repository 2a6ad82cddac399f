"""Reverse-mode differentiation over the IR.

`gradients(e, loss, wrt)` appends the backward nodes to the emitter `e` and returns one
gradient node per entry of `wrt`. Every order is fixed:

- Nodes are visited in reverse creation order (the reverse of the emitter's list).
- A node's cotangent is the left fold, with `add`, of its contributions in the order they
  arrived: consumers are visited latest first, and one consumer gives its inputs'
  contributions in input position order. A node read twice by one consumer (`mul x x`) gets
  two contributions from it, first-position first.
- Only nodes on a path from some `wrt` node to `loss` get a cotangent; a `wrt` node that the
  loss does not read gets a zero gradient.
"""

from __future__ import annotations

from sexpgpu.graph.core.ir import FLOAT_DTYPES, Node
from sexpgpu.graph.core.ops import OPS


def gradients(e, loss: Node, wrt: list, seed: Node | None = None) -> list:
    """`seed` is the cotangent of `loss` (ones unless given: a tensor `loss` then stands for
    the scalar whose gradient it carries, as a stacked graph's model output does)."""
    order = _nodes_up_to(e.nodes, loss)
    active = _depends_on(order, wrt)
    contributions = {loss: [seed if seed is not None else e.const(1, like=loss, shape=loss.shape)]}
    totals = {}
    for node in reversed(order):
        parts = contributions.pop(node, None)
        if parts is None:
            continue
        with e.at(node.name, node.loc):
            total = _fold(e, parts)
            totals[node] = total
            if not node.inputs:
                continue
            vjp = OPS[node.op].vjp
            if vjp is None:
                continue
            for source, grad in zip(node.inputs, vjp(e, node, total)):
                if grad is not None and id(source) in active:
                    contributions.setdefault(source, []).append(grad)
    return [totals.get(node) or e.const(0, like=node, shape=node.shape) for node in wrt]


def _fold(e, parts: list) -> Node:
    total = parts[0]
    for part in parts[1:]:
        total = e("add", total, part)
    return total


def _nodes_up_to(nodes: list, loss: Node) -> list:
    """The nodes made before `loss`, and `loss`, in creation order."""
    for index, node in enumerate(nodes):
        if node is loss:
            return nodes[: index + 1]
    raise AssertionError("the loss is not a node of this emitter")


def _depends_on(order: list, wrt: list) -> set:
    """ids of float nodes that read some `wrt` node, directly or not (and the `wrt` nodes)."""
    active = {id(node) for node in wrt}
    for node in order:
        if node.dtype in FLOAT_DTYPES and any(id(source) in active for source in node.inputs):
            active.add(id(node))
    return active
