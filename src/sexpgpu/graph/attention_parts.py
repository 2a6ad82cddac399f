"""The attention ops written as the ops they are made of, for a backend that fuses only some.

attention_core, attention_grad_q and attention_grad_kv are single ops so that a backend may
run them fused; their definition (graph/ops.py) is a composition of ordinary ops, the one the
CPU interpreter follows step for step. `composed_attention` gives a graph in which each
float32 attention op is that composition, node for node (the interpreter's exact mode sums
that graph exactly; the CUDA backend fuses float32 attention too and never composes it):

    P  = softmax(where(causal_mask, (q @ k^T) * scale, -inf))     along the keys
    o  = P @ v
    D  = sum(g * o) along the output's width, broadcast over the keys
    dS = P * (g @ v^T - D)
    dq = (dS @ k) * scale;  dk = (dS^T @ q) * scale;  dv = P^T @ g;  [dk dv] along the last axis

Only float32 nodes are composed here: a bf16 node rounds inside its products in ways its
own kernels follow (backends/cpu/op_kernels.py), so it keeps its op.
"""

from __future__ import annotations

from sexpgpu.graph.emit import Emitter
from sexpgpu.graph.ir import Graph, Node

ATTENTION_OPS = ("attention_core", "attention_grad_q", "attention_grad_kv")


def composed_attention(graph: Graph) -> Graph:
    """`graph` with every float32 attention op written out as its composition; the same graph
    when there is none."""
    if not any(_composed(node) for node in graph.nodes):
        return graph
    e = Emitter()
    mapped: dict = {}
    for node in graph.nodes:
        inputs = tuple(mapped[id(source)] for source in node.inputs)
        with e.at(node.name, node.loc):
            if _composed(node):
                mapped[id(node)] = PARTS[node.op](e, node.attrs, *inputs)
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


def _probabilities(e: Emitter, attrs, q: Node, k: Node) -> Node:
    scores = _scaled(e, e("matmul", q, _swapped(e, k)), attrs)
    if attrs["causal"]:
        mask = e("causal_mask", size=scores.shape[-1])
        scores = e("where", mask, scores, e.const(float("-inf"), like=scores))
    return e("softmax", scores, axis=scores.rank - 1)


def _score_cotangent(e: Emitter, attrs, q, k, v, o, g) -> tuple:
    """(P, dS)."""
    probabilities = _probabilities(e, attrs, q, k)
    delta = e("sum", e("mul", g, o), axes=(g.rank - 1,), keep=True)
    spread = e("broadcast", delta, shape=probabilities.shape)
    return probabilities, e("mul", probabilities, e("sub", e("matmul", g, _swapped(e, v)), spread))


def _core(e: Emitter, attrs, q, k, v) -> Node:
    return e("matmul", _probabilities(e, attrs, q, k), v)


def _grad_q(e: Emitter, attrs, q, k, v, o, g) -> Node:
    _, score_grad = _score_cotangent(e, attrs, q, k, v, o, g)
    return _scaled(e, e("matmul", score_grad, k), attrs)


def _grad_kv(e: Emitter, attrs, q, k, v, o, g) -> Node:
    probabilities, score_grad = _score_cotangent(e, attrs, q, k, v, o, g)
    grad_k = _scaled(e, e("matmul", _swapped(e, score_grad), q), attrs)
    grad_v = e("matmul", _swapped(e, probabilities), g)
    return e("concat", grad_k, grad_v, axis=grad_k.rank - 1)


PARTS = {"attention_core": _core, "attention_grad_q": _grad_q, "attention_grad_kv": _grad_kv}
