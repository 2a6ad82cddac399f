"""The op cases every op test shares: each op of graph/core/ops.py with inputs of chosen dtypes,
shapes and value kinds, the graph that runs it, and the tolerances between two backends.

A case with a gradient builds `loss = sum(op(inputs) * w)` and its gradients with the graph
stage's own autodiff, so one graph holds the op's forward computation and its gradient rule.
tests/graph/test_op_gradients.py checks the rules against float64 finite differences, the
CUDA tests (tests/cuda/) check the CUDA backend against the CPU interpreter, and
tests/backends/test_op_coverage.py fails when an op of the table has no case here.

Value kinds: "normal", "positive", "spread" (distinct, well separated values: no ties, no
kinks), "small" (integers in [-2, 2], for ties), "wide" (normal times 1000), "labels:N"
(integers in [0, N)), "bool".
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sexpgpu.backends.cpu.arith import round_bf16
from sexpgpu.graph.training.autodiff import gradients
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ir import FLOAT_DTYPES

F = "f32"
B = "bf16"


class OpCase(NamedTuple):
    op: str
    specs: list  # one (dtype, shape, value kind) per input
    attrs: dict

# Tolerances, relative and absolute, of a CUDA output against the interpreter's. Sums run in
# another order (a fixed tree rather than a sequential fold) and, until the numerics library
# offers its functions to Triton, exp/log/tanh/erf come from libdevice (within 2 ulp).
# A reduction over n terms may differ by about n ulp of its largest partial sum.
TOLERANCE = {"f32": (2e-5, 2e-6), "bf16": (1.6e-2, 1e-3)}

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
    ("cast", [(B, (3, 4), "normal")], {"dtype": "f32"}),
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
    ("matmul", [(B, (3, 8), "normal"), (B, (8, 5), "normal")], {}),
    ("layernorm", [(B, (3, 40), "normal")], {"eps": 1e-5}),
    ("softmax", [(F, (3, 2500), "normal")], {"axis": -1}),
    ("conv2d", [(F, (2, 2, 5, 7), "normal"), (F, (3, 2, 2, 3), "normal")], {"stride": (1, 2), "padding": (0, 1)}),
    ("conv2d_input_grad", [(F, (2, 3, 4, 4), "normal"), (F, (3, 2, 2, 3), "normal")],
     {"stride": (1, 2), "padding": (0, 1), "input_shape": (2, 2, 5, 7)}),
    ("conv2d_weight_grad", [(F, (2, 2, 5, 7), "normal"), (F, (2, 3, 4, 4), "normal")],
     {"stride": (1, 2), "padding": (0, 1), "weight_shape": (3, 2, 2, 3)}),
    ("max_pool2d", [(F, (1, 3, 6, 4), "spread")], {"kernel": (2, 2), "stride": (1, 2)}),
    ("max_pool2d_grad", [(F, (1, 3, 6, 4), "spread"), (F, (1, 3, 5, 2), "normal")], {"kernel": (2, 2), "stride": (1, 2)}),
    ("max_pool2d_pick", [(F, (1, 3, 6, 4), "spread"), (F, (1, 3, 6, 4), "normal")], {"kernel": (2, 2), "stride": (1, 2)}),
    ("avg_pool2d", [(F, (1, 3, 6, 5), "normal")], {"kernel": (3, 2), "stride": (3, 1)}),
    ("avg_pool2d_grad", [(F, (1, 3, 2, 4), "normal")], {"kernel": (3, 2), "stride": (3, 1), "input_shape": (1, 3, 6, 5)}),
    # H 6 leaves a row no window reaches
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
    ("attention_core", [(F, (2, 3, 4), "normal"), (F, (2, 5, 4), "normal"), (F, (2, 5, 3), "normal")],
     {"scale": 0.5, "causal": False}),
    ("attention_core", [(F, (2, 4, 3), "normal")] * 3, {"scale": 0.7, "causal": True}),
    # more keys than a block of the interpreted kernels (16), an odd length, heads
    ("attention_core", [(F, (2, 2, 19, 4), "normal")] * 3, {"scale": 0.5, "causal": True}),
]
CASES = [OpCase(*case) for case in CASES]

# Cases for the GPU alone: PyTorch's CPU bf16 convolution, which the interpreter tests would
# run, does not accumulate in float32 as cuDNN does.
GPU_CASES = [
    OpCase("conv2d", [(B, (2, 4, 6, 6), "normal"), (B, (4, 4, 3, 3), "normal")], {"stride": (1, 1), "padding": (1, 1)}),
]

_SALT = ("i32", (), "labels:1000")
_DRAW = {"shape": (3, 5), "seed": 11, "stream": "test/draw", "salts": ("step",)}

# Ops without a gradient, and integer forms of ops with one, checked forward only.
FORWARD_CASES = [
    ("argmax", [(F, (3, 5), "spread")], {"axis": 1}),
    ("argmax", [(F, (4, 1, 3), "spread")], {"axis": 0}),  # not the last axis: the space has the input's rank
    ("one_hot", [("i32", (2, 3), "labels:4")], {"depth": 4, "dtype": "f32"}),
    ("eq", [(F, (3, 4), "small"), (F, (4,), "small")], {}),
    ("ne", [(F, (3, 4), "small"), (F, (3, 1), "small")], {}),
    ("lt", [(F, (3, 4), "normal"), (F, (3, 4), "normal")], {}),
    ("le", [("i32", (3, 4), "labels:3"), ("i32", (), "labels:3")], {}),
    ("gt", [(F, (2, 3), "small"), (F, (2, 3), "small")], {}),
    ("ge", [(B, (4,), "small"), (B, (2, 4), "small")], {}),
    ("const", [], {"value": 2.5, "dtype": "f32", "shape": (2, 3)}),
    ("causal_mask", [], {"size": 5}),
    ("normal", [_SALT], dict(_DRAW, mean=0.5, std=2.0)),
    ("uniform", [_SALT], dict(_DRAW, low=-1.0, high=3.0)),
    ("truncated_normal", [_SALT], dict(_DRAW, mean=0.0, std=1.0, bound=2.0)),
    ("bernoulli", [_SALT], dict(_DRAW, p=0.3)),
    ("randint", [_SALT], dict(_DRAW, low=0, high=7)),
    ("cast", [(F, (3, 4), "wide")], {"dtype": "i32"}),
    ("cast", [("i32", (3, 4), "labels:9")], {"dtype": "f32"}),
    ("sum", [("i32", (3, 4), "labels:9")], {"axes": (1,), "keep": False}),
    ("add", [("i32", (3, 4), "labels:9"), ("i32", (4,), "labels:9")], {}),
    # any o: the CUDA lowering then computes the forward's statistics itself
    ("attention_grad_q", [(F, (2, 4, 3), "normal")] * 2 + [(F, (2, 4, 2), "normal")] * 3, {"scale": 0.6, "causal": True}),
    ("attention_grad_kv", [(F, (2, 3, 4), "normal"), (F, (2, 5, 4), "normal"), (F, (2, 5, 3), "normal")]
     + [(F, (2, 3, 3), "normal")] * 2, {"scale": 0.5, "causal": False}),
]
FORWARD_CASES = [OpCase(*case) for case in FORWARD_CASES]


def case_elements(case) -> int:
    """The element count of the case's largest input (0 for a case without inputs)."""
    return max((int(np.prod(shape, dtype=np.int64)) for _, shape, _ in case.specs), default=0)


def case_id(case) -> str:
    op, specs, attrs = case
    shapes = "-".join(dtype + "x".join(map(str, shape)) for dtype, shape, _ in specs)
    return f"{op}-{shapes}" + ("-" + str(attrs.get("axis")) if "axis" in attrs else "")


def random_array(rng, dtype: str, shape: tuple, kind: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if kind.startswith("labels:"):
        return rng.integers(0, int(kind.split(":")[1]), shape).astype(np.int32)
    count = int(np.prod(shape, dtype=np.int64))
    if kind == "positive":
        values = rng.uniform(0.5, 2.0, count)
    elif kind == "spread":
        values = rng.permutation(count) * 0.37 - count * 0.15 + rng.uniform(-0.05, 0.05, count)
    elif kind == "small":
        values = rng.integers(-2, 3, count).astype(np.float64)
    elif kind == "wide":
        values = rng.standard_normal(count) * 1e3
    else:
        values = rng.standard_normal(count)
    values = values.reshape(shape).astype(np.float32)
    if dtype == "bf16":
        values = round_bf16(values)
    return values


def case_graph(case, seed: int = 0, differentiate: bool = True):
    """(graph, inputs): the op, a weighted sum as the loss, and the gradients."""
    op, specs, attrs = case
    rng = np.random.default_rng(seed)
    e = Emitter()
    nodes, values = [], {}
    for index, (dtype, shape, kind) in enumerate(specs):
        nodes.append(e.input(f"x{index}", dtype, shape))
        values[f"x{index}"] = random_array(rng, dtype, shape, kind)
    y = e(op, *nodes, **attrs)
    inputs = {f"x{index}": node for index, node in enumerate(nodes)}
    if not differentiate:
        return e.graph(inputs, {"y": y}), values
    weights = e.input("w", y.dtype, y.shape)
    inputs["w"] = weights
    values["w"] = random_array(rng, y.dtype, y.shape, "normal")
    loss = e("sum", e("mul", y, weights), axes=None)
    wrt = [node for node in nodes if node.dtype in FLOAT_DTYPES]
    grads = gradients(e, loss, wrt)
    outputs = {"y": y, "loss": loss, **{f"grad{index}": grad for index, grad in enumerate(grads)}}
    return e.graph(inputs, outputs), values


def assert_matches(name: str, got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    rtol, atol = TOLERANCE["bf16" if dtype == "bf16" else "f32"]
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=name)
