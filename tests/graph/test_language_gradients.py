"""The built-in ops of the language (compositions and layers) differentiated end to end,
against float64 central differences: loss = sum(expression * w) over every float input and
parameter, in the interpreter's float64 reference mode."""

from __future__ import annotations

import numpy as np
import pytest

from graph_helpers import expression_graph
from sexpgpu import numerics as nx
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.graph.training.autodiff import gradients
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ir import FLOAT_DTYPES, make_graph

X = ((3, 4), "f32")
CASES = [
    ("(mean x :axis 1)", {"x": X}),
    ("(mean (max x :axis (0 1) :keep true))", {"x": X}),
    ("(mse x y)", {"x": X, "y": X}),
    ("(cross-entropy x labels)", {"x": X, "labels": ((3,), "i32")}),
    ("(softmax x :axis 0)", {"x": X}),
    ("(log-softmax x)", {"x": X}),
    ("(gelu x)", {"x": X}),
    ("(pow (exp x) 3)", {"x": X}),
    ("(div 1 (add 2 (square x)))", {"x": X}),
    ("(linear x :out 2 :as fc)", {"x": ((2, 3, 4), "f32")}),
    ("(linear x :out 2 :as fc :bias false)", {"x": ((4,), "f32")}),
    ("(layernorm x :as ln :eps 0.01)", {"x": X}),
    ("(attention x :heads 2 :as a)", {"x": ((2, 3, 4), "f32")}),
    ("(attention x :heads 1 :as a :causal false)", {"x": ((3, 4), "f32")}),
    ("(embedding ids :vocab 5 :dim 3 :as e)", {"ids": ((2, 4), "i32")}),
    ("(dropout x :p 0.4 :salt :step)", {"x": X}),
    ("(concat x (transpose (reshape x (4 3)) (1 0)) :axis 0)", {"x": X}),
    ("(slice (broadcast x (2 3 4)) :axis 2 :start 1)", {"x": X}),
]


def _values(graph, rng) -> dict:
    values = {}
    for name, node in graph.inputs.items():
        if node.dtype in FLOAT_DTYPES:
            values[name] = rng.standard_normal(node.shape)
        elif name == "step":
            values[name] = 3
        else:
            values[name] = rng.integers(0, 3, node.shape).astype(np.int32)
    return values


@pytest.mark.parametrize("text, inputs", CASES, ids=[case[0] for case in CASES])
def test_language_op_gradient(text, inputs):
    if "dropout" in text and not hasattr(nx, "bernoulli"):
        pytest.skip("sexpgpu.numerics is not built yet")
    forward = expression_graph(text, inputs)
    e = Emitter()
    e.nodes = list(forward.nodes)
    y = forward.outputs["y"]
    weights = e.input("w", "f32", y.shape)
    loss = e("sum", e("mul", y, weights), axes=None)
    wrt = [(name, node) for name, node in forward.inputs.items() if node.dtype in FLOAT_DTYPES]
    grads = gradients(e, loss, [node for _, node in wrt])
    inputs_all = dict(forward.inputs, w=weights)
    graph = make_graph(inputs_all, {f"g/{name}": grad for (name, _), grad in zip(wrt, grads)}, e.nodes)
    loss_graph = make_graph(inputs_all, {"loss": loss}, e.nodes)
    rng = np.random.default_rng(0)
    values = _values(forward, rng)
    values["w"] = rng.standard_normal(y.shape)
    reference = Interpreter("f64")
    analytic = reference.run(graph, values)
    for name, _ in wrt:
        numeric = np.zeros(values[name].shape)
        for index in np.ndindex(numeric.shape):
            losses = []
            for sign in (1.0, -1.0):
                moved = values[name].copy()
                moved[index] += sign * 1e-6
                losses.append(float(reference.run(loss_graph, {**values, name: moved})["loss"]))
            numeric[index] = (losses[0] - losses[1]) / 2e-6
        np.testing.assert_allclose(analytic[f"g/{name}"], numeric, rtol=1e-6, atol=1e-7, err_msg=name)
