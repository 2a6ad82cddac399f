"""The attention ops written as the ops they are made of, for a backend that fuses only some.

attention_core, attention_grad_q and attention_grad_kv are single ops so that a backend may
run them fused; their definition (graph/core/ops.py) is a composition of ordinary ops, the one the
CPU interpreter follows step for step. `composed_attention` gives a graph in which each
float32 attention op is that composition (the interpreter's exact mode sums that graph
exactly, and so does the CUDA backend's; its float32 arithmetic fuses attention instead):

    P  = softmax(where(causal_mask, (q @ k^T) * scale, -inf))     along the keys
    o  = P @ v
    D  = sum(g * o) along the output's width, broadcast over the keys
    dS = P * (g @ v^T - D)
    dq = (dS @ k) * scale;  dk = (dS^T @ q) * scale;  dv = P^T @ g;  [dk dv] along the last axis

The parts of one attention share their nodes: P is made once, for the output and both
cotangents, and dS once for dq and dk (the ops take the same q, k, v, o and g), so a composed
backward multiplies by v^T once and never recomputes the scores or their softmax. Every
node is a function of its inputs, so sharing it changes no bit; the cost is memory: each
attention's P (T x T a head) lives from the forward to the backward.

Only float32 nodes are composed here: a bf16 node rounds inside its products in ways its
own kernels follow (backends/cpu/op_kernels.py), so it keeps its op.
"""

from __future__ import annotations

from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ir import Graph, Node

ATTENTION_OPS = ("attention_core", "attention_grad_q", "attention_grad_kv")


def composed_attention(graph: Graph) -> Graph:
    """`graph` with every float32 attention op written out as its composition; the same graph
    when there is none."""
    if not any(_composed(node) for node in graph.nodes):
        return graph
    e = Emitter()
    parts = _Parts(e)
    mapped: dict = {}
    for node in graph.nodes:
        inputs = tuple(mapped[id(source)] for source in node.inputs)
        with e.at(node.name, node.loc):
            if _composed(node):
                mapped[id(node)] = PARTS[node.op](parts, node.attrs, *inputs)
            elif all(new is old for new, old in zip(inputs, node.inputs)):
                e.nodes.append(node)
                mapped[id(node)] = node
            else:
                mapped[id(node)] = e(node.op, *inputs, **node.attrs)
    outputs = {name: mapped[id(node)] for name, node in graph.outputs.items()}
    return e.graph(dict(graph.inputs), outputs)


def _composed(node: Node) -> bool:
    return node.op in ATTENTION_OPS and node.dtype == "f32"


def _swapped(e: Emitter, x: Node) -> Node:
    return e("transpose", x, perm=tuple(range(x.rank - 2)) + (x.rank - 1, x.rank - 2))


def _scaled(e: Emitter, x: Node, attrs) -> Node:
    return e("mul", x, e.const(attrs["scale"], like=x))


class _Parts:
    """The nodes the attention ops of a graph are made of, each made once for its operands:
    the probabilities of (q, k) and the score cotangent of (q, k, v, o, g), under one scale
    and mask."""

    def __init__(self, e: Emitter):
        self.e = e
        self.made: dict = {}

    def _once(self, what: str, attrs, operands: tuple, make):
        key = (what, attrs["scale"], attrs["causal"], *map(id, operands))
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]

    def probabilities(self, attrs, q: Node, k: Node) -> Node:
        return self._once("P", attrs, (q, k), lambda: _probabilities(self.e, attrs, q, k))

    def score_cotangent(self, attrs, q, k, v, o, g) -> Node:
        """dS = P * (g @ v^T - D)."""
        def make():
            return _score_cotangent(self.e, self.probabilities(attrs, q, k), v, o, g)

        return self._once("dS", attrs, (q, k, v, o, g), make)


def _probabilities(e: Emitter, attrs, q: Node, k: Node) -> Node:
    scores = _scaled(e, e("matmul", q, _swapped(e, k)), attrs)
    if attrs["causal"]:
        mask = e("causal_mask", size=scores.shape[-1])
        scores = e("where", mask, scores, e.const(float("-inf"), like=scores))
    return e("softmax", scores, axis=scores.rank - 1)


def _score_cotangent(e: Emitter, probabilities: Node, v, o, g) -> Node:
    delta = e("sum", e("mul", g, o), axes=(g.rank - 1,), keep=True)
    spread = e("broadcast", delta, shape=probabilities.shape)
    return e("mul", probabilities, e("sub", e("matmul", g, _swapped(e, v)), spread))


def _core(parts: _Parts, attrs, q, k, v) -> Node:
    return parts.e("matmul", parts.probabilities(attrs, q, k), v)


def _grad_q(parts: _Parts, attrs, q, k, v, o, g) -> Node:
    return _scaled(parts.e, parts.e("matmul", parts.score_cotangent(attrs, q, k, v, o, g), k), attrs)


def _grad_kv(parts: _Parts, attrs, q, k, v, o, g) -> Node:
    e = parts.e
    grad_k = _scaled(e, e("matmul", _swapped(e, parts.score_cotangent(attrs, q, k, v, o, g)), q), attrs)
    grad_v = e("matmul", _swapped(e, parts.probabilities(attrs, q, k)), g)
    return e("concat", grad_k, grad_v, axis=grad_k.rank - 1)


PARTS = {"attention_core": _core, "attention_grad_q": _grad_q, "attention_grad_kv": _grad_kv}
