"""Graphs for the tests of cuDNN's native pattern graphs, shared by the Triton-interpreter tests
(tests/cuda/test_patterns_interpret.py, against tests/cuda/fake_frontend.py) and the GPU tests
(tests/cuda/test_patterns_gpu.py, against cuDNN's frontend)."""

from __future__ import annotations

import numpy as np

from op_cases import random_array
from sexpgpu.graph.training.autodiff import gradients
from sexpgpu.graph.core.emit import Emitter

# (x, w, bias) shapes of each product: a (batch, tokens, features) linear layer, an NCHW convolution
SHAPES = {"matmul": ((2, 3, 8), (5, 8), (5,)), "conv2d": ((2, 3, 6, 6), (4, 3, 3, 3), (4,))}


def epilogue_graph(product: str, dtype: str, activation: str | None, seed: int = 0, differentiate: bool = True,
                   shapes=None):
    """x -> product with w (`shapes`: of x, w and the bias; SHAPES' by default) -> (cast to f32) -> + bias -> activation, a weighted sum as the
    loss, and the gradients of x, w and the bias: the training graph of a layer (without
    `differentiate`, its forward alone)."""
    rng = np.random.default_rng(seed)
    e = Emitter()
    shapes = shapes or SHAPES[product]
    inputs = {name: e.input(name, "f32", shape) for name, shape in zip(("x", "w", "b"), shapes)}
    values = {name: random_array(rng, "f32", shape, "normal") for name, shape in zip(("x", "w", "b"), shapes)}
    x, w, b = inputs.values()

    def narrowed(node):
        return node if dtype == "f32" else e("cast", node, dtype=dtype)

    if product == "matmul":
        made = e("matmul", narrowed(x), narrowed(e("transpose", w, perm=(1, 0))))
        bias = b
    else:
        made = e("conv2d", narrowed(x), narrowed(w), stride=(1, 1), padding=(1, 1))
        bias = e("reshape", b, shape=(shapes[1][0], 1, 1))
    summed = e("add", made if dtype == "f32" else e("cast", made, dtype="f32"), bias)
    y = e(activation, summed) if activation else summed
    if not differentiate:
        return e.graph(inputs, {"y": y}), values
    weights = inputs["g"] = e.input("g", "f32", y.shape)
    values["g"] = random_array(rng, "f32", y.shape, "normal")
    loss = e("sum", e("mul", y, weights), axes=None)
    grads = gradients(e, loss, [x, w, b])
    outputs = {"y": y, "loss": loss, **{f"grad/{name}": grad for name, grad in zip("xwb", grads)}}
    return e.graph(inputs, outputs), values


def strided_attention_graph(shapes: dict, causal: bool, seed: int = 3):
    """bf16 attention of q, k, v given as (batch, tokens, heads, width) and transposed to
    (batch, heads, tokens, width) views, a weighted sum as the loss, and its three gradients."""
    rng = np.random.default_rng(seed)
    e = Emitter()
    nodes = {name: e.input(name, "bf16", shape) for name, shape in shapes.items()}
    values = {name: random_array(rng, "bf16", shape, "normal") for name, shape in shapes.items()}
    q, k, v = (e("transpose", node, perm=(0, 2, 1, 3)) for node in nodes.values())
    out = e("attention_core", q, k, v, scale=1 / np.sqrt(shapes["q"][-1]), causal=causal)
    weights = e.input("g", "bf16", out.shape)
    values["g"] = random_array(rng, "bf16", out.shape, "normal")
    loss = e("sum", e("cast", e("mul", out, weights), dtype="f32"), axes=None)
    grads = gradients(e, loss, list(nodes.values()))
    outputs = {"y": out, "loss": loss, **{f"d{name}": grad for name, grad in zip("qkv", grads)}}
    return e.graph({**nodes, "g": weights}, outputs), values
