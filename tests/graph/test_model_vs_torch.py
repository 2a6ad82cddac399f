"""A small causal transformer built from the language, forward and backward, against the
same model written in plain PyTorch (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graph_helpers import experiment
from sexpgpu import numerics as nx
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.graph import compile_program

TEXT = """
(defgraph block (x) :width 8 :heads 2
  (let a (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (add a (linear (gelu (linear (layernorm a :as ln2) :out 16 :as up)) :out width :as down)))

(defgraph lm (x) :vocab 7 :width 8 :context 5
  (let tokens (embedding x :vocab vocab :dim width :as embed))
  (let h (repeat 2 block (add tokens (param positions (context width) :init (normal :std 0.02))) :as block))
  (linear (layernorm h :as final) :out vocab :as head))

(defrun lm :seed 1 :data (text pydoc :context 5) :model (lm x) :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1) :batch 3 :steps 1)
"""
BATCH, CONTEXT, WIDTH, HEADS, VOCAB = 3, 5, 8, 2, 7


def _torch_loss(p: dict, x, y):
    def linear(h, scope, bias=True):
        out = h @ p[f"{scope}/w"].T
        return out + p[f"{scope}/b"] if bias else out

    def norm(h, scope):
        return F.layer_norm(h, (WIDTH,), p[f"{scope}/gain"], p[f"{scope}/bias"], eps=1e-5)

    def attention(h, scope):
        def heads(t):
            return t.reshape(BATCH, CONTEXT, HEADS, WIDTH // HEADS).transpose(1, 2)

        q, k, v = (heads(h @ p[f"{scope}/{name}"].T) for name in ("wq", "wk", "wv"))
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return mixed.transpose(1, 2).reshape(BATCH, CONTEXT, WIDTH) @ p[f"{scope}/wo"].T

    h = p["embed/table"][x] + p["positions"]
    for index in range(2):
        scope = f"block{index}"
        a = h + attention(norm(h, f"{scope}/ln1"), f"{scope}/attn")
        h = a + linear(F.gelu(linear(norm(a, f"{scope}/ln2"), f"{scope}/up")), f"{scope}/down")
    logits = linear(norm(h, "final"), "head")
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def _setup():
    program = compile_program(experiment(TEXT))
    rng = np.random.default_rng(0)
    params = {path: (rng.standard_normal(spec.shape) * 0.5) for path, spec in program.params.items()}
    tokens = rng.integers(0, VOCAB, (BATCH, CONTEXT + 1)).astype(np.int32)
    return program, params, tokens[:, :-1], tokens[:, 1:]


def _torch_reference(params, x, y):
    tensors = {path: torch.tensor(value, dtype=torch.float64, requires_grad=True) for path, value in params.items()}
    loss = _torch_loss(tensors, torch.from_numpy(x).long(), torch.from_numpy(y).long())
    loss.backward()
    return float(loss.detach()), {path: tensor.grad.numpy() for path, tensor in tensors.items()}


def _ours(interpreter, program, params, x, y):
    dtype = interpreter.math.float_dtype
    feed = {f"param/{path}": value.astype(dtype) for path, value in params.items()}
    feed.update({"field/x": x, "field/y": y})
    return interpreter.run(program.training.micro, feed)


def test_transformer_loss_and_gradients_match_torch_in_float64():
    program, params, x, y = _setup()
    loss, grads = _torch_reference(params, x, y)
    ours = _ours(Interpreter("f64"), program, params, x, y)
    assert float(ours["loss"]) == pytest.approx(loss, rel=1e-12)
    assert set(grads) == {name[len("grad/"):] for name in ours if name.startswith("grad/")}
    for path, grad in grads.items():
        np.testing.assert_allclose(ours[f"grad/{path}"], grad, rtol=1e-9, atol=1e-12, err_msg=path)


@pytest.mark.skipif(not hasattr(nx, "erf"), reason="sexpgpu.numerics is not built yet")
def test_transformer_matches_torch_in_float32_to_float32_precision():
    program, params, x, y = _setup()
    loss, grads = _torch_reference(params, x, y)
    ours = _ours(Interpreter(), program, params, x, y)
    assert float(ours["loss"]) == pytest.approx(loss, rel=2e-6)
    for path, grad in grads.items():
        scale = np.abs(grad).max()
        np.testing.assert_allclose(ours[f"grad/{path}"], grad, rtol=1e-3, atol=1e-4 * scale, err_msg=path)
