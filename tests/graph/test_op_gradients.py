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

from op_cases import CASES, case_elements, case_graph, case_id
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.graph.training.autodiff import gradients
from sexpgpu.graph.core.ir import FLOAT_DTYPES, make_graph

# Each float input costs two forward runs per element; larger cases are the CUDA tests'.
SMALL_CASES = [case for case in CASES if case_elements(case) <= 200]


def _differentiated(case, seed=0):
    """(the graph of loss and gradients, the graph of the loss alone, float64 values, the
    positions of the inputs that get a gradient)."""
    graph, values = case_graph(case, seed)
    forward = make_graph(graph.inputs, {"loss": graph.outputs["loss"]}, list(graph.nodes))
    values = {name: value.astype(np.float64) if value.dtype.kind == "f" else value for name, value in values.items()}
    positions = [index for index, (dtype, _, _) in enumerate(case.specs) if dtype in FLOAT_DTYPES]
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


@pytest.mark.parametrize("case", SMALL_CASES, ids=case_id)
def test_gradient_matches_float64_finite_differences(case):
    graph, forward, values, positions = _differentiated(case)
    analytic = Interpreter("f64").run(graph, values)
    for number, position in enumerate(positions):
        numeric = _finite_differences(forward, values, f"x{position}")
        np.testing.assert_allclose(analytic[f"grad{number}"], numeric, rtol=1e-6, atol=1e-7,
                                   err_msg=f"{case.op} input {position}")


def test_a_value_read_twice_gets_both_contributions_in_order():
    from sexpgpu.graph.core.emit import Emitter

    e = Emitter()
    x = e.input("x", "f32", (3,))
    loss = e("sum", e("mul", x, x), axes=None)
    (grad,) = gradients(e, loss, [x])
    assert grad.op == "add"  # two contributions, folded by one add
    graph = e.graph({"x": x}, {"g": grad})
    values = np.array([1.5, -2.0, 0.25], np.float64)
    np.testing.assert_array_equal(Interpreter("f64").run(graph, {"x": values})["g"], 2 * values)


def test_a_parameter_the_loss_does_not_read_gets_zeros():
    from sexpgpu.graph.core.emit import Emitter

    e = Emitter()
    x, unused = e.input("x", "f32", (2,)), e.input("u", "f32", (4,))
    loss = e("sum", x, axes=None)
    grad_x, grad_unused = gradients(e, loss, [x, unused])
    graph = e.graph({"x": x, "u": unused}, {"gx": grad_x, "gu": grad_unused})
    out = Interpreter("f64").run(graph, {"x": np.ones(2), "u": np.ones(4)})
    np.testing.assert_array_equal(out["gu"], np.zeros(4))
    np.testing.assert_array_equal(out["gx"], np.ones(2))
