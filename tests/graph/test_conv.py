"""Convolution and pooling: the ops against PyTorch in float64, the interpreter's float32 sums
against plain loops in the order conv.py documents, the first-maximum rule, the layers of the
language, and a small CNN's loss and gradients against the same network in PyTorch.

The gradient rules themselves are checked against finite differences with every other op's,
in test_op_gradients.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graph_helpers import experiment, expression_graph
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph import compile_program
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ops import OpError

# (x shape, w shape, stride, padding): odd sizes, rectangular kernels, windows that leave rows out
GEOMETRIES = [
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1)),
    ((2, 3, 9, 8), (5, 3, 3, 2), (2, 3), (0, 1)),
    ((1, 2, 5, 5), (3, 2, 5, 5), (2, 2), (2, 2)),
    ((3, 1, 6, 7), (2, 1, 1, 1), (1, 2), (0, 0)),
]
POOLS = [((2, 2), (2, 2)), ((3, 3), (2, 2)), ((2, 3), (1, 2)), ((3, 1), (3, 1))]


def _run_op(op: str, arrays: list, attrs: dict, precision: str = "f64", dtype: str = "f32") -> np.ndarray:
    e = Emitter()
    nodes = [e.input(f"x{index}", dtype, array.shape) for index, array in enumerate(arrays)]
    graph = e.graph({f"x{index}": node for index, node in enumerate(nodes)}, {"y": e(op, *nodes, **attrs)})
    return Interpreter(precision).run(graph, {f"x{index}": array for index, array in enumerate(arrays)})["y"]


def _torch_conv_and_grads(x, w, g, stride, padding):
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    out = F.conv2d(xt, wt, stride=stride, padding=padding)
    out.backward(torch.tensor(g))
    return out.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_conv2d_and_its_gradients_match_torch_in_float64(geometry):
    x_shape, w_shape, stride, padding = geometry
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    attrs = {"stride": stride, "padding": padding}
    out = _run_op("conv2d", [x, w], attrs)
    g = rng.standard_normal(out.shape)
    reference, grad_x, grad_w = _torch_conv_and_grads(x, w, g, stride, padding)
    np.testing.assert_allclose(out, reference, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_run_op("conv2d_input_grad", [g, w], dict(attrs, input_shape=x_shape)), grad_x,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_run_op("conv2d_weight_grad", [x, g], dict(attrs, weight_shape=w_shape)), grad_w,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window", POOLS, ids=str)
def test_pools_and_their_gradients_match_torch_in_float64(window):
    kernel, stride = window
    rng = np.random.default_rng(2)
    x = rng.permutation(2 * 3 * 7 * 8).reshape(2, 3, 7, 8) * 0.25 - 40.0  # distinct: no ties
    attrs = {"kernel": kernel, "stride": stride}
    for op, torch_pool in (("max_pool2d", F.max_pool2d), ("avg_pool2d", F.avg_pool2d)):
        xt = torch.tensor(x, requires_grad=True)
        reference = torch_pool(xt, kernel, stride)
        g = rng.standard_normal(tuple(reference.shape))
        reference.backward(torch.tensor(g))
        np.testing.assert_allclose(_run_op(op, [x], attrs), reference.detach().numpy(), rtol=1e-13, atol=0)
        grad = (_run_op("max_pool2d_grad", [x, g], attrs) if op == "max_pool2d"
                else _run_op("avg_pool2d_grad", [g], dict(attrs, input_shape=x.shape)))
        np.testing.assert_allclose(grad, xt.grad.numpy(), rtol=1e-13, atol=1e-15, err_msg=op)


# --- the float32 orders of conv.py, by plain loops -----------------------------------------------


def _padded(x, padding):
    return np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))


def _fold(terms, start=None):
    acc = start
    for term in terms:
        acc = term if acc is None else np.float32(acc + term)
    return acc


def _loop_conv2d(x, w, stride, padding, shape):
    xp = _padded(x, padding)
    out = np.empty(shape, np.float32)
    _, channels, kh, kw = w.shape
    for n, o, y, c0 in np.ndindex(*shape):
        out[n, o, y, c0] = _fold(np.float32(xp[n, c, stride[0] * y + a, stride[1] * c0 + b] * w[o, c, a, b])
                                 for c in range(channels) for a in range(kh) for b in range(kw))
    return out


def _loop_weight_grad(x, g, stride, padding, shape):
    xp = _padded(x, padding)
    out = np.empty(shape, np.float32)
    batch, _, rows, cols = g.shape
    for o, c, a, b in np.ndindex(*shape):
        out[o, c, a, b] = _fold(np.float32(g[n, o, y, z] * xp[n, c, stride[0] * y + a, stride[1] * z + b])
                                for n in range(batch) for y in range(rows) for z in range(cols))
    return out


def _loop_input_grad(g, w, stride, padding, shape):
    batch, channels, height, width = shape
    out_channels, _, kh, kw = w.shape
    rows, cols = g.shape[2:]
    out = np.empty(shape, np.float32)
    for n, c, i, j in np.ndindex(*shape):
        terms = []
        for y in range(rows):  # the windows reaching (i, j), in C order
            for z in range(cols):
                a, b = i + padding[0] - stride[0] * y, j + padding[1] - stride[1] * z
                if 0 <= a < kh and 0 <= b < kw:
                    terms.append(_fold(np.float32(w[o, c, a, b] * g[n, o, y, z]) for o in range(out_channels)))
        out[n, c, i, j] = _fold(terms, start=np.float32(0.0))
    return out


def test_float32_conv2d_sums_in_the_documented_order_bit_for_bit():
    rng = np.random.default_rng(3)
    x_shape, w_shape, stride, padding = (2, 3, 7, 6), (3, 3, 3, 2), (2, 1), (1, 1)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    attrs = {"stride": stride, "padding": padding}
    out = _run_op("conv2d", [x, w], attrs, "f32")
    np.testing.assert_array_equal(out, _loop_conv2d(x, w, stride, padding, out.shape))
    g = rng.standard_normal(out.shape).astype(np.float32)
    np.testing.assert_array_equal(_run_op("conv2d_weight_grad", [x, g], dict(attrs, weight_shape=w_shape), "f32"),
                                  _loop_weight_grad(x, g, stride, padding, w_shape))
    np.testing.assert_array_equal(_run_op("conv2d_input_grad", [g, w], dict(attrs, input_shape=x_shape), "f32"),
                                  _loop_input_grad(g, w, stride, padding, x_shape))


def test_float32_pools_sum_in_the_documented_order_bit_for_bit():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 7, 7)).astype(np.float32)
    attrs = {"kernel": (3, 3), "stride": (2, 2)}  # overlapping windows: up to four sums meet
    average = _run_op("avg_pool2d", [x], attrs, "f32")
    windows = [[x[:, :, 2 * y : 2 * y + 3, 2 * z : 2 * z + 3] for z in range(3)] for y in range(3)]
    expected = np.empty(average.shape, np.float32)
    for n, c, y, z in np.ndindex(*average.shape):
        expected[n, c, y, z] = np.float32(_fold(windows[y][z][n, c].reshape(-1)) / np.float32(9))
    np.testing.assert_array_equal(average, expected)
    g = rng.standard_normal(average.shape).astype(np.float32)
    share = g / np.float32(9)
    spread = np.zeros(x.shape, np.float32)
    for y in range(3):  # each element receives from its windows in C order
        for z in range(3):
            for a in range(3):
                for b in range(3):
                    spread[:, :, 2 * y + a, 2 * z + b] += share[:, :, y, z]
    np.testing.assert_array_equal(_run_op("avg_pool2d_grad", [g], dict(attrs, input_shape=x.shape), "f32"), spread)


# --- the first maximum --------------------------------------------------------------------------


def _one_image(rows):
    return np.array(rows, np.float64)[None, None]


def test_max_pool_gradient_goes_to_the_first_maximum_in_window_order():
    x = _one_image([[1.0, 5.0, 5.0, 0.0],
                    [5.0, 2.0, 3.0, 3.0]])
    g = _one_image([[10.0, 20.0]])
    attrs = {"kernel": (2, 2), "stride": (2, 2)}
    grad = _run_op("max_pool2d_grad", [x, g], attrs)
    np.testing.assert_array_equal(grad[0, 0], [[0.0, 10.0, 20.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(_run_op("max_pool2d_pick", [x, x * 2], attrs)[0, 0], [[10.0, 10.0]])


def test_max_pool_takes_the_first_nan_and_equal_zeros_in_order():
    nan = float("nan")
    x = _one_image([[1.0, nan, -0.0, 0.0],
                    [nan, 2.0, 0.0, -1.0]])
    attrs = {"kernel": (2, 2), "stride": (2, 2)}
    pooled = _run_op("max_pool2d", [x], attrs)[0, 0, 0]
    assert np.isnan(pooled[0]) and pooled[1] == 0.0 and not np.signbit(pooled[1])
    grad = _run_op("max_pool2d_grad", [x, _one_image([[3.0, 4.0]])], attrs)
    np.testing.assert_array_equal(grad[0, 0], [[0.0, 3.0, 4.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_overlapping_max_windows_add_their_gradients():
    x = _one_image([[0.0, 1.0, 0.0],
                    [0.0, 9.0, 0.0],
                    [0.0, 1.0, 0.0]])
    grad = _run_op("max_pool2d_grad", [x, _one_image([[1.0, 2.0], [3.0, 4.0]])], {"kernel": (2, 2), "stride": (1, 1)})
    assert grad[0, 0, 1, 1] == 10.0 and np.count_nonzero(grad) == 1


def test_overlapping_max_windows_add_in_window_order():
    x = np.zeros((1, 1, 5, 5), np.float32)
    x[0, 0, 2, 2] = 1.0  # the maximum of all four 3x3 windows, 2 apart
    g = _one_image([[1e8, 1.0], [-1e8, 1.0]]).astype(np.float32)
    grad = _run_op("max_pool2d_grad", [x, g], {"kernel": (3, 3), "stride": (2, 2)}, "f32")
    assert grad[0, 0, 2, 2] == 1.0  # ((1e8 + 1) - 1e8) + 1 in float32; the reverse order gives 0


# --- rules of the op table --------------------------------------------------------------------------


def _emit(op, shapes, attrs):
    e = Emitter()
    return e(op, *(e.input(f"x{index}", "f32", shape) for index, shape in enumerate(shapes)), **attrs)


def test_conv2d_result_shape_and_canonical_attributes():
    node = _emit("conv2d", [(2, 3, 9, 8), (5, 3, 3, 2)], {"stride": 2, "padding": (0, 1)})
    assert node.shape == (2, 5, 4, 5)
    assert dict(node.attrs) == {"stride": (2, 2), "padding": (0, 1)}
    pooled = _emit("max_pool2d", [(2, 3, 9, 8)], {"kernel": 3})
    assert pooled.shape == (2, 3, 3, 2) and dict(pooled.attrs) == {"kernel": (3, 3), "stride": (3, 3)}


@pytest.mark.parametrize("op, shapes, attrs, code, words", [
    ("conv2d", [(2, 3, 9), (5, 3, 3, 2)], {}, "E-SHAPE-001", "must be (N C H W), got (2 3 9)"),
    ("conv2d", [(2, 3, 9, 8), (5, 4, 3, 3)], {}, "E-SHAPE-001", "has 3 channels, the weight (5 4 3 3) expects 4"),
    ("conv2d", [(2, 3, 2, 8), (5, 3, 3, 3)], {}, "E-SHAPE-001", "a (3 3) window does not fit in (2 8)"),
    ("conv2d", [(2, 3, 9, 8), (5, 3, 3, 3)], {"stride": 0}, "E-GRAPH-003", ":stride must be"),
    ("conv2d", [(2, 3, 9, 8), (5, 3, 3, 3)], {"padding": (1, -1)}, "E-GRAPH-003", ":padding must be"),
    ("max_pool2d", [(2, 3, 9, 8)], {"kernel": (10, 2)}, "E-SHAPE-001", "a (10 2) window does not fit in (9 8)"),
    ("conv2d_input_grad", [(2, 5, 3, 3), (5, 3, 3, 3)], {"input_shape": (2, 3, 9, 9)}, "E-SHAPE-001",
     "the cotangent is (2 5 3 3), expected (2 5 7 7)"),
])
def test_op_rules_reject_bad_shapes_and_attributes(op, shapes, attrs, code, words):
    with pytest.raises(OpError) as error:
        _emit(op, shapes, attrs)
    assert error.value.code == code and words in error.value.message


# --- the language ---------------------------------------------------------------------------------


def test_conv2d_layer_declares_oihw_weight_and_bias():
    graph = expression_graph("(conv2d x :out 4 :kernel (3 2) :stride 2 :padding 1 :as c1)", {"x": ((2, 3, 8, 8), "f32")})
    assert graph.inputs["param/c1/w"].shape == (4, 3, 3, 2)
    assert graph.inputs["param/c1/b"].shape == (4,)
    conv = next(node for node in graph.nodes if node.op == "conv2d")
    assert dict(conv.attrs) == {"stride": (2, 2), "padding": (1, 1)}
    assert graph.outputs["y"].shape == (2, 4, 4, 5)


def test_conv2d_without_bias_and_pools_with_their_default_stride():
    graph = expression_graph("(avg-pool (max-pool (conv2d x :out 2 :kernel 1 :bias false :as c) :kernel 2) :kernel (1 3))",
                             {"x": ((1, 1, 6, 6), "f32")})
    assert "param/c/b" not in graph.inputs
    assert graph.outputs["y"].shape == (1, 2, 3, 1)
    pools = [dict(node.attrs) for node in graph.nodes if node.op.endswith("pool2d")]
    assert pools == [{"kernel": (2, 2), "stride": (2, 2)}, {"kernel": (1, 3), "stride": (1, 3)}]


def test_conv2d_layer_on_bf16_images_reads_bf16_weights():
    graph = expression_graph("(conv2d x :out 2 :kernel 3 :as c)", {"x": ((1, 2, 4, 4), "bf16")})
    assert graph.inputs["param/c/w"].dtype == "f32"
    assert graph.outputs["y"].dtype == "bf16"
    conv = next(node for node in graph.nodes if node.op == "conv2d")
    assert [source.op for source in conv.inputs] == ["input", "cast"]


def test_bf16_conv2d_sums_in_float32_and_rounds_once():
    from sexpgpu.backends.cpu.arith import round_bf16

    graph = expression_graph("(conv2d x :out 2 :kernel 3 :padding 1 :as c)", {"x": ((2, 3, 5, 5), "bf16")})
    rng = np.random.default_rng(6)
    x = round_bf16(rng.standard_normal((2, 3, 5, 5)).astype(np.float32))
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    out = Interpreter().run(graph, {"x": x, "param/c/w": w, "param/c/b": b})["y"]
    f32 = _run_op("conv2d", [x, round_bf16(w)], {"padding": (1, 1)}, "f32")
    np.testing.assert_array_equal(out, round_bf16(round_bf16(f32) + round_bf16(b)[:, None, None]))


@pytest.mark.parametrize("text, code, words", [
    ("(conv2d x :out 2 :kernel 3 :as c)", "E-SHAPE-001", "conv2d needs images (N C H W), got (4 5)"),
    ("(max-pool x :kernel 2)", "E-SHAPE-001", "max-pool needs images"),
    ("(conv2d y :out 2 :kernel (3 3 3) :as c)", "E-GRAPH-003", "a list of two like (3 3)"),
    ("(conv2d y :out 0 :kernel 3 :as c)", "E-FORM-011", ":out of (conv2d ...) must be from 1 to 2^31-1, found 0"),
    ("(conv2d y :out 2 :kernel 3 :stride 0 :as c)", "E-GRAPH-003", ":stride must be"),
    ("(avg-pool y :kernel 9)", "E-SHAPE-001", "a (9 9) window does not fit in (6 6)"),
])
def test_layer_errors_name_the_problem(text, code, words):
    with pytest.raises(SexpgpuError) as error:
        expression_graph(text, {"x": ((4, 5), "f32"), "y": ((2, 1, 6, 6), "f32")})
    assert error.value.code == code and words in error.value.message


# --- a small CNN against PyTorch ------------------------------------------------------------------

CNN = """
(defgraph cnn (x)
  (let h1 (max-pool (relu (conv2d x :out 4 :kernel 3 :padding 1 :as c1)) :kernel 2 :stride 1))
  (let h2 (avg-pool (relu (conv2d h1 :out 5 :kernel (2 3) :stride 2 :as c2)) :kernel 2))
  (linear (reshape h2 (batch -1)) :out 3 :as head))
(defrun r :seed 1 :data (records "d.npz") :model (cnn x) :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1) :batch 3 :steps 1)
"""


def _torch_cnn(p, x, y):
    h = F.max_pool2d(F.relu(F.conv2d(x, p["c1/w"], p["c1/b"], padding=1)), 2, 1)
    h = F.avg_pool2d(F.relu(F.conv2d(h, p["c2/w"], p["c2/b"], stride=2)), 2)
    return F.cross_entropy(h.reshape(3, -1) @ p["head/w"].T + p["head/b"], y)


def test_cnn_loss_and_gradients_match_torch_in_float64():
    program = compile_program(experiment(CNN), field_specs={"x": ((2, 9, 9), "f32"), "y": ((), "i32")})
    rng = np.random.default_rng(5)
    params = {path: rng.standard_normal(spec.shape) * 0.5 for path, spec in program.params.items()}
    x = rng.standard_normal((3, 2, 9, 9))
    y = np.array([0, 2, 1], np.int32)
    tensors = {path: torch.tensor(value, requires_grad=True) for path, value in params.items()}
    loss = _torch_cnn(tensors, torch.tensor(x), torch.tensor(y).long())
    loss.backward()
    feed = {f"param/{path}": value for path, value in params.items()}
    ours = Interpreter("f64").run(program.training.micro, dict(feed, **{"field/x": x, "field/y": y}))
    assert float(ours["loss"]) == pytest.approx(float(loss.detach()), rel=1e-12)
    assert sorted(params) == ["c1/b", "c1/w", "c2/b", "c2/w", "head/b", "head/w"]
    for path, tensor in tensors.items():
        np.testing.assert_allclose(ours[f"grad/{path}"], tensor.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=path)


def test_conv2d_weight_fans_are_torchs():
    from torch.nn.init import _calculate_fan_in_and_fan_out

    from sexpgpu import numerics as nx

    shape = (6, 4, 3, 2)
    assert nx.fans(shape) == _calculate_fan_in_and_fan_out(torch.empty(shape)) == (4 * 3 * 2, 6 * 3 * 2)
