"""Mixed precision: the run's `:precision` as a rewrite of the forward graph.

    with_precision(e, precision, roots) -> the roots' nodes in the rewritten graph

`:precision bf16` rewrites the nodes an emitter has made so far (the model and its loss,
before autodiff) by each op's policy (`OpDef.precision`, graph/core/ops.py):

- `product` (matmul, conv2d and its two cotangents): each float32 operand is cast to bf16,
  the op sums in float32 and rounds its result once to bf16 (every backend's bf16 product,
  as cuBLAS and cuDNN give it), and one cast widens the result back to float32 for its
  readers. `attention` (attention_core; its cotangent ops are made by autodiff, after this
  rewrite) is such a product of q, k and v: its scores are a bf16 product's result, its
  softmax runs in float32, its probabilities are rounded to bf16 where they meet v, and its
  output is rounded once to bf16 (op_kernels.py gives the steps). Each product casts its own
  operands, even a value another product reads too:
  so every bf16 value has one reader, and the cotangents of a value read by several
  products (attention's q, k and v of one input) are summed in float32, not in bf16.
- `float32`: the op reads and writes what the graph gives it, float32 where the model is
  float32: elementwise arithmetic, the normalisations and their statistics (softmax,
  log_softmax, layernorm, the sums and maxima), the loss, and what moves or picks values.

So the only bf16 values are the products' operands and results; every other activation is
stored in float32. The casts are nodes of the graph, so the interpreter rounds at exactly
the points where the GPU does. Autodiff then runs over the rewritten graph: a cast's
gradient is the cast back (ops.py), so a product's cotangent reaches it in bf16, the
backward products run in bf16 too, and each parameter's gradient arrives in float32.
Parameters, their gradients, the optimizer's state and the update graph stay float32.
Nodes the model already makes in bf16 (a bf16 parameter, an explicit `cast`) are left as
written; `:precision f32` leaves the graph as it is.
"""

from __future__ import annotations

from sexpgpu.graph.core.ops import OPS


def with_precision(e, precision: str, roots: list) -> list:
    """Rewrite the nodes `e` has made for `precision`, in place, and give `roots` in the
    rewritten graph. Unchanged nodes stay the same objects (inputs, constants)."""
    if precision == "f32":
        return list(roots)
    if precision != "bf16":
        raise ValueError(f"precision must be f32 or bf16 (lang.defrun's PRECISIONS), not {precision!r}")
    old_nodes, e.nodes = e.nodes, []
    mapped = e.rewrite(old_nodes, _in_bf16)
    return [mapped[id(root)] for root in roots]


def _in_bf16(e, node, inputs):
    """A float32 product made on bf16 casts of its operands and widened back; None otherwise."""
    if OPS[node.op].precision.kind != "product" or node.dtype != "f32":
        return None
    product = e(node.op, *(e("cast", source, dtype="bf16") for source in inputs), **node.attrs)
    return e("cast", product, dtype="f32")
