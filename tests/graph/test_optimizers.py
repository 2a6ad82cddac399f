"""The update graph against plain PyTorch optimizers (float64), step by step.

The same summed microbatch gradients go into our update graph and into torch: torch gets
their mean as `.grad`, clips with clip_grad_norm_ and steps. In the interpreter's float64
mode the two agree to rounding; in its float32 mode to float32 precision.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sexpgpu import numerics as nx
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.backends.cpu.arith import round_bf16
from sexpgpu.graph.frontend.records import Initializer, ParamSpec
from sexpgpu.graph.training.optimizers import build_update
from sexpgpu.lang.experiment import OptimizerSpec

SHAPES = {"b": (4,), "w": (3, 4)}
MICROBATCHES = 2
LRS = [0.1, 0.05, 0.02, 0.07]

OPTIMIZERS = {
    "sgd": (OptimizerSpec("sgd", lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "momentum": (OptimizerSpec("momentum", lr=0.1, momentum=0.8),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8)),
    "nesterov": (OptimizerSpec("momentum", lr=0.1, momentum=0.9, nesterov=True),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
    "adam": (OptimizerSpec("adam", lr=0.1, beta1=0.8, beta2=0.95, eps=1e-6),
             lambda p: torch.optim.Adam(p, lr=0.1, betas=(0.8, 0.95), eps=1e-6)),
    "adamw": (OptimizerSpec("adamw", lr=0.1, weight_decay=0.1),
              lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1)),
    "adamw-clipped": (OptimizerSpec("adamw", lr=0.1, weight_decay=0.01, clip=0.5),
                      lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.01)),
    "sgd-clipped": (OptimizerSpec("sgd", lr=0.1, clip=1.0), lambda p: torch.optim.SGD(p, lr=0.1)),
}


def _params(dtype="f32") -> dict:
    return {path: ParamSpec(path, shape, dtype, Initializer("zeros"), None) for path, shape in SHAPES.items()}


def _gradient_sums(steps: int) -> list:
    rng = np.random.default_rng(7)
    return [{path: (rng.standard_normal(shape) * (1 + 2 * step)).astype(np.float32) for path, shape in SHAPES.items()}
            for step in range(steps)]


def _ours(spec, interpreter, params, grads_per_step):
    graph, slots = build_update(_params(), spec, MICROBATCHES)
    dtype = interpreter.math.float_dtype
    params = {path: value.astype(dtype) for path, value in params.items()}
    state = {name: np.zeros(node.shape, dtype) for name, node in graph.inputs.items() if name.startswith("state/")}
    history = []
    for step, grads in enumerate(grads_per_step, 1):
        feed = {f"param/{p}": v for p, v in params.items()}
        feed.update({f"grad/{p}": g.astype(dtype) for p, g in grads.items()})
        feed.update(state)
        feed.update({"step": step, "lr": LRS[step - 1]})
        out = interpreter.run(graph, feed)
        params = {p: out[f"param/{p}"] for p in params}
        state = {name: out[name] for name in state}
        history.append((dict(params), float(out["grad_norm"])))
    return history


def _torch(make, clip, params, grads_per_step):
    tensors = {path: torch.tensor(value, dtype=torch.float64, requires_grad=True) for path, value in params.items()}
    optimizer = make(list(tensors.values()))
    history = []
    for step, grads in enumerate(grads_per_step, 1):
        for path, tensor in tensors.items():
            tensor.grad = torch.tensor(grads[path], dtype=torch.float64) / MICROBATCHES
        norm = torch.nn.utils.clip_grad_norm_(list(tensors.values()), clip if math.isfinite(clip) else float("inf"))
        for group in optimizer.param_groups:
            group["lr"] = LRS[step - 1]
        optimizer.step()
        history.append(({path: tensor.detach().numpy().copy() for path, tensor in tensors.items()}, float(norm)))
    return history


def _compare(ours, theirs, rtol, atol):
    for (our_params, our_norm), (their_params, their_norm) in zip(ours, theirs):
        assert our_norm == pytest.approx(their_norm, rel=rtol)
        for path in SHAPES:
            np.testing.assert_allclose(our_params[path], their_params[path], rtol=rtol, atol=atol, err_msg=path)


def _start():
    rng = np.random.default_rng(3)
    return {path: rng.standard_normal(shape).astype(np.float32) for path, shape in SHAPES.items()}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_update_matches_torch_in_float64(name):
    spec, make = OPTIMIZERS[name]
    grads = _gradient_sums(4)
    _compare(_ours(spec, Interpreter("f64"), _start(), grads), _torch(make, spec.clip, _start(), grads), 1e-10, 1e-12)


@pytest.mark.skipif(not hasattr(nx, "pow"), reason="sexpgpu.numerics is not built yet")
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_update_matches_torch_in_float32(name):
    spec, make = OPTIMIZERS[name]
    grads = _gradient_sums(4)
    _compare(_ours(spec, Interpreter(), _start(), grads), _torch(make, spec.clip, _start(), grads), 2e-5, 2e-6)


def test_clipping_reports_the_norm_before_clipping():
    spec, _ = OPTIMIZERS["sgd-clipped"]
    grads = _gradient_sums(1)
    (params, norm), = _ours(spec, Interpreter("f64"), _start(), grads)
    mean = {p: g.astype(np.float64) / MICROBATCHES for p, g in grads[0].items()}
    expected = math.sqrt(sum(float((g**2).sum()) for g in mean.values()))
    assert norm == pytest.approx(expected, rel=1e-12) and norm > 1.0


def test_bf16_parameters_update_in_float32_and_round_back():
    spec = OptimizerSpec("sgd", lr=0.5)
    graph, _ = build_update({"w": ParamSpec("w", (3,), "bf16", Initializer("zeros"), None)}, spec, 1)
    start = round_bf16(np.array([1.0, 2.0, -3.0], np.float32))
    grad = np.array([0.001, 0.3, 1.0], np.float32)
    out = Interpreter().run(graph, {"param/w": start, "grad/w": grad, "step": 1, "lr": np.float32(0.5)})
    expected = round_bf16(start - np.float32(0.5) * grad)
    assert out["param/w"].tobytes() == expected.tobytes()
    assert out["param/w"][0] == 1.0  # 1 - 0.0005 rounds back to 1 in bf16


def test_grad_norm_is_one_left_fold_over_the_flat_layout():
    spec = OptimizerSpec("sgd", lr=0.1)
    graph, _ = build_update(_params(), spec, MICROBATCHES)
    grads = _gradient_sums(1)[0]
    feed = {f"param/{p}": v for p, v in _start().items()}
    feed.update({f"grad/{p}": g for p, g in grads.items()})
    feed.update({"step": 1, "lr": np.float32(0.1)})
    norm = Interpreter().run(graph, feed)["grad_norm"]
    flat = np.concatenate([grads[path].ravel() / np.float32(MICROBATCHES) for path in sorted(SHAPES)])
    total = np.float32(flat[0] * flat[0])
    for value in flat[1:]:
        total = np.float32(total + np.float32(value * value))
    assert norm.tobytes() == np.sqrt(total).tobytes()
