"""Every op's gradient rule against float64 central finite differences.

Each case builds `loss = sum(op(inputs) * w)` with a random cotangent `w`, differentiates it
with autodiff, and runs both the gradient graph and the perturbed forward graphs in the
interpreter's float64 reference mode (numpy float64 functions, no bf16 rounding), so the
comparison measures the rule and not float32 noise. Inputs are kept away from kinks and
ties (relu at 0, max ties).
"""

from __future__ import annotations

import numpy as np
import pytest

from graph_helpers import single_op_graph
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.graph.autodiff import gradients
from sexpgpu.graph.ir import FLOAT_DTYPES
from sexpgpu.graph.ops import OPS

F = "f32"
CASES = [
    ("neg", [(F, (3, 4), "normal")], {}),
    ("relu", [(F, (3, 4), "spread")], {}),
    ("gelu", [(F, (3, 4), "normal")], {}),
    ("tanh", [(F, (3, 4), "normal")], {}),
    ("exp", [(F, (3, 4), "normal")], {}),
    ("log", [(F, (3, 4), "positive")], {}),
    ("sqrt", [(F, (3, 4), "positive")], {}),
    ("rsqrt", [(F, (3, 4), "positive")], {}),
    ("sigmoid", [(F, (3, 4), "normal")], {}),
    ("square", [(F, (3, 4), "normal")], {}),
    ("erf", [(F, (3, 4), "normal")], {}),
    ("cast", [(F, (3, 4), "normal")], {"dtype": "bf16"}),
    ("cast", [("bf16", (3, 4), "normal")], {"dtype": "f32"}),
    ("add", [(F, (3, 4), "normal"), (F, (4,), "normal")], {}),
    ("sub", [(F, (2, 1, 3), "normal"), (F, (4, 3), "normal")], {}),
    ("mul", [(F, (3, 1), "normal"), (F, (1, 4), "normal")], {}),
    ("div", [(F, (3, 4), "normal"), (F, (3, 4), "positive")], {}),
    ("pow", [(F, (3, 4), "positive"), (F, (3, 4), "normal")], {}),
    ("pow", [(F, (3, 4), "positive"), (F, (), "normal")], {}),
    ("maximum", [(F, (3, 4), "normal"), (F, (4,), "normal")], {}),
    ("minimum", [(F, (3, 4), "normal"), (F, (3, 4), "normal")], {}),
    ("where", [("bool", (3, 4), "bool"), (F, (3, 4), "normal"), (F, (4,), "normal")], {}),
    ("sum", [(F, (2, 3, 4), "normal")], {"axes": (0, 2), "keep": False}),
    ("sum", [(F, (2, 3, 4), "normal")], {"axes": (1,), "keep": True}),
    ("sum", [(F, (2, 3), "normal")], {"axes": None}),
    ("max", [(F, (2, 3, 4), "spread")], {"axes": (1,), "keep": False}),
    ("max", [(F, (2, 3, 4), "spread")], {"axes": (0, 2), "keep": True}),
    ("softmax", [(F, (4, 3), "normal")], {"axis": 0}),
    ("softmax", [(F, (2, 3, 5), "normal")], {"axis": -1}),
    ("log_softmax", [(F, (3, 5), "normal")], {"axis": -1}),
    ("layernorm", [(F, (3, 5), "normal")], {"eps": 1e-5}),
    ("cross_entropy", [(F, (2, 3, 5), "normal"), ("i32", (2, 3), "labels:5")], {}),
    ("gather", [(F, (5, 3), "normal"), ("i32", (2, 4), "labels:5")], {}),
    ("scatter_add", [("i32", (6,), "labels:4"), (F, (6, 3), "normal")], {"rows": 4}),
    ("reshape", [(F, (2, 6), "normal")], {"shape": (3, 4)}),
    ("transpose", [(F, (2, 3, 4), "normal")], {"perm": (2, 0, 1)}),
    ("slice", [(F, (4, 5), "normal")], {"axis": 1, "start": 1, "stop": 4}),
    ("pad", [(F, (3, 2), "normal")], {"axis": 0, "before": 1, "after": 2}),
    ("concat", [(F, (2, 1), "normal"), (F, (2, 3), "normal"), (F, (2, 2), "normal")], {"axis": 1}),
    ("broadcast", [(F, (3, 1), "normal")], {"shape": (2, 3, 4)}),
    ("matmul", [(F, (3, 4), "normal"), (F, (4, 2), "normal")], {}),
    ("matmul", [(F, (2, 3, 4), "normal"), (F, (4, 5), "normal")], {}),
    ("matmul", [(F, (3, 4), "normal"), (F, (2, 4, 5), "normal")], {}),
    ("matmul", [(F, (2, 1, 3, 4), "normal"), (F, (5, 4, 2), "normal")], {}),
    # window ops (test_conv.py checks them against torch); H 6 leaves a row no window reaches
    ("conv2d", [(F, (2, 3, 6, 4), "normal"), (F, (2, 3, 3, 2), "normal")], {"stride": (2, 1), "padding": (1, 0)}),
    ("conv2d_input_grad", [(F, (2, 2, 3, 3), "normal"), (F, (2, 3, 3, 2), "normal")],
     {"stride": (2, 1), "padding": (1, 0), "input_shape": (2, 3, 6, 4)}),
    ("conv2d_weight_grad", [(F, (2, 3, 6, 4), "normal"), (F, (2, 2, 3, 3), "normal")],
     {"stride": (2, 1), "padding": (1, 0), "weight_shape": (2, 3, 3, 2)}),
    ("max_pool2d", [(F, (2, 2, 5, 5), "spread")], {"kernel": (3, 3), "stride": (2, 2)}),
    ("max_pool2d_grad", [(F, (2, 2, 5, 5), "spread"), (F, (2, 2, 2, 2), "normal")], {"kernel": (3, 3), "stride": (2, 2)}),
    ("max_pool2d_pick", [(F, (2, 2, 5, 5), "spread"), (F, (2, 2, 5, 5), "normal")], {"kernel": (3, 3), "stride": (2, 2)}),
    ("avg_pool2d", [(F, (2, 2, 5, 6), "normal")], {"kernel": (2, 3), "stride": (1, 2)}),
    ("avg_pool2d_grad", [(F, (2, 2, 4, 2), "normal")], {"kernel": (2, 3), "stride": (1, 2), "input_shape": (2, 2, 5, 6)}),
]


def _case_id(case) -> str:
    op, specs, _ = case
    return op + "-" + "-".join("x".join(map(str, shape)) or "scalar" for _, shape, _ in specs)


def _differentiated(op, specs, attrs, seed=0):
    e, nodes, y, arrays = single_op_graph(op, specs, attrs, seed)
    weights = e.input("w", y.dtype, y.shape)
    loss = e("sum", e("mul", y, weights), axes=None)
    wrt = [node for node in nodes if node.dtype in FLOAT_DTYPES]
    grads = gradients(e, loss, wrt)
    inputs = {f"x{index}": node for index, node in enumerate(nodes)}
    inputs["w"] = weights
    graph = e.graph(inputs, {"loss": loss, **{f"g{index}": grad for index, grad in enumerate(grads)}})
    forward = e.graph(inputs, {"loss": loss})
    values = {f"x{index}": array for index, array in enumerate(arrays)}
    values["w"] = np.random.default_rng(seed + 1).standard_normal(y.shape)
    positions = [index for index, node in enumerate(nodes) if node.dtype in FLOAT_DTYPES]
    return graph, forward, values, positions


def _finite_differences(forward, values: dict, name: str) -> np.ndarray:
    reference = Interpreter("f64")
    base = values[name]
    result = np.zeros(base.shape)
    for index in np.ndindex(base.shape):
        step = 1e-6 * max(1.0, abs(base[index]))
        losses = []
        for sign in (1, -1):
            moved = base.copy()
            moved[index] += sign * step
            losses.append(float(reference.run(forward, {**values, name: moved})["loss"]))
        result[index] = (losses[0] - losses[1]) / (2 * step)
    return result


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gradient_matches_float64_finite_differences(case):
    op, specs, attrs = case
    graph, forward, values, positions = _differentiated(op, specs, attrs)
    analytic = Interpreter("f64").run(graph, values)
    for number, position in enumerate(positions):
        numeric = _finite_differences(forward, values, f"x{position}")
        np.testing.assert_allclose(analytic[f"g{number}"], numeric, rtol=1e-6, atol=1e-7, err_msg=f"{op} input {position}")


def test_every_differentiable_op_has_a_case():
    differentiable = {name for name, definition in OPS.items() if definition.vjp is not None}
    assert differentiable <= {case[0] for case in CASES}


def test_a_value_read_twice_gets_both_contributions_in_order():
    from sexpgpu.graph.emit import Emitter

    e = Emitter()
    x = e.input("x", "f32", (3,))
    loss = e("sum", e("mul", x, x), axes=None)
    (grad,) = gradients(e, loss, [x])
    assert grad.op == "add"  # two contributions, folded by one add
    graph = e.graph({"x": x}, {"g": grad})
    values = np.array([1.5, -2.0, 0.25], np.float64)
    np.testing.assert_array_equal(Interpreter("f64").run(graph, {"x": values})["g"], 2 * values)


def test_a_parameter_the_loss_does_not_read_gets_zeros():
    from sexpgpu.graph.emit import Emitter

    e = Emitter()
    x, unused = e.input("x", "f32", (2,)), e.input("u", "f32", (4,))
    loss = e("sum", x, axes=None)
    grad_x, grad_unused = gradients(e, loss, [x, unused])
    graph = e.graph({"x": x, "u": unused}, {"gx": grad_x, "gu": grad_unused})
    out = Interpreter("f64").run(graph, {"x": np.ones(2), "u": np.ones(4)})
    np.testing.assert_array_equal(out["gu"], np.zeros(4))
    np.testing.assert_array_equal(out["gx"], np.ones(2))
