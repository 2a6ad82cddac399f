"""Stacking (graph/training/stacking.py): k microbatches as one batch draw, lose and learn as k calls do."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_helpers import experiment
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.backends.cpu.draws import draw
from sexpgpu.graph import compile_program
from sexpgpu.graph.training.stacking import StackingRefused, stack_generator, stack_training, stacking_blockers

SPECS = {"x": ((3,), "f32"), "y": ((), "i32"), "id": ((), "i32")}
B, M = 2, 4

DRAWN = """
(defgraph net (x)
  (let h (dropout (tanh (linear x :out 5 :as fc)) :p 0.25 :salt :step))
  (let noise (normal (batch 5) :std 0.5))
  (let shared (uniform (5) :low -0.1 :high 0.1))
  (linear (add (add h noise) shared) :out 3 :as head))
(defrun r :seed 9 :data (records "d.npz") :model (net x) :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1) :batch 2 :microbatches 4 :steps 1)
"""

PLAIN = """
(defgraph net (x) (linear (tanh (linear x :out 5 :as fc)) :out 3 :as head))
(defrun r :seed 9 :data (records "d.npz") :model (net x) :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1) :batch 2 :microbatches 4 :steps 1)
"""


def _program(text: str):
    return compile_program(experiment(text), SPECS)


def _microbatches(seed: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M * B, 3)).astype(np.float32)
    y = rng.integers(0, 3, M * B).astype(np.int32)
    return x, y


def _params(program, seed: int = 5) -> dict:
    rng = np.random.default_rng(seed)
    return {f"param/{path}": (0.5 * rng.standard_normal(spec.shape)).astype(np.float32) for path, spec in program.params.items()}


def _draws(graph) -> dict:
    return {node.attrs["stream"]: node for node in graph.nodes if "stream" in node.attrs}


@pytest.mark.parametrize("degree", [2, 4])
def test_a_stacked_draw_is_each_microbatchs_unstacked_draw_bit_for_bit(degree):
    program = _program(DRAWN)
    unstacked = _draws(program.training.micro)
    stacked = _draws(stack_training(program.training, degree).micro)
    assert list(stacked) == list(unstacked) == ["dropout#0", "normal#0", "uniform#0"]
    step = [np.int32(7)]
    for stream, node in unstacked.items():
        salts = step if node.inputs else []
        alone = draw(node, salts)
        together = draw(stacked[stream], salts)
        if stream == "uniform#0":  # no batch axis: one draw shared by every record, as unstacked
            assert together.shape == alone.shape and stacked[stream].attrs.get("repeats") is None
            np.testing.assert_array_equal(together.view(np.uint8), alone.view(np.uint8))
            continue
        assert together.shape == (degree * alone.shape[0],) + alone.shape[1:]
        for index in range(degree):  # each microbatch's slice holds the unstacked call's bits
            piece = together[index * alone.shape[0]:(index + 1) * alone.shape[0]]
            np.testing.assert_array_equal(piece.view(np.uint8), alone.view(np.uint8))


def test_a_stacked_call_gives_each_microbatchs_loss_bit_for_bit_and_the_summed_gradients():
    program = _program(DRAWN)
    interpreter = Interpreter()
    params = _params(program)
    x, y = _microbatches()
    micro = program.training.micro
    losses, grads = [], None
    for m in range(M):
        out = interpreter.run(micro, {**params, "field/x": x[m * B:(m + 1) * B], "field/y": y[m * B:(m + 1) * B], "step": np.int32(7)})
        losses.append(out["loss"])
        part = {name: value.astype(np.float64) for name, value in out.items() if name.startswith("grad/")}
        grads = part if grads is None else {name: grads[name] + part[name] for name in grads}
    stacked = stack_training(program.training, M)
    out = interpreter.run(stacked.micro, {**params, "field/x": x, "field/y": y, "step": np.int32(7)})
    assert out["loss"].shape == (M,)
    np.testing.assert_array_equal(out["loss"].view(np.uint32), np.asarray(losses, np.float32).view(np.uint32))
    for name, total in grads.items():
        np.testing.assert_allclose(out[name], total, rtol=1e-5, atol=1e-6)


def test_stacked_loss_and_gradients_match_a_float64_torch_computation():
    program = _program(PLAIN)
    params = _params(program)
    x, y = _microbatches()
    out = Interpreter().run(stack_training(program.training, 2).micro, {**params, "field/x": x[:2 * B], "field/y": y[:2 * B]})
    weights = {name: torch.tensor(value, dtype=torch.float64, requires_grad=True) for name, value in params.items()}
    losses = []
    for m in range(2):
        rows = torch.tensor(x[m * B:(m + 1) * B], dtype=torch.float64)
        hidden = torch.tanh(rows @ weights["param/fc/w"].T + weights["param/fc/b"])
        logits = hidden @ weights["param/head/w"].T + weights["param/head/b"]
        losses.append(torch.nn.functional.cross_entropy(logits, torch.tensor(y[m * B:(m + 1) * B], dtype=torch.long)))
    (losses[0] + losses[1]).backward()
    np.testing.assert_allclose(out["loss"], [float(loss) for loss in losses], rtol=1e-6)
    for name, weight in weights.items():
        np.testing.assert_allclose(out[name.replace("param/", "grad/")], weight.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_the_degree_must_divide_the_microbatches():
    program = _program(PLAIN)
    with pytest.raises(ValueError, match="must divide :microbatches \\(4\\); 3 does not"):
        stack_training(program.training, 3)
    assert stack_training(program.training, 1) is program.training
    assert stack_training(program.training, 2) is stack_training(program.training, 2)  # built once


@pytest.mark.parametrize("salt, reason", [
    (":salt :microbatch", "salted with :microbatch"),
    (":salt (:step (field id))", "salted with the field id"),
])
def test_salts_that_differ_between_microbatches_keep_the_run_unstacked(salt, reason):
    assert reason in " ".join(stacking_blockers(_program(DRAWN.replace(":salt :step", salt))))
    assert stacking_blockers(_program(DRAWN)) == []


@pytest.mark.parametrize("body, reason", [
    ("(softmax (linear x :out 3 :as head) :axis 0)", "softmax at 'top level' combines records"),
    ("(add (linear x :out 3 :as head) (broadcast (slice x :axis 0 :start 0 :stop 1) (batch 3)))", "combines records"),
    ("(mul (linear x :out 3 :as head) (reshape (layernorm (sum x :axis 1) :as n) (batch 1)))",
     "layernorm at 'n' combines records"),
    ("(transpose (linear x :out 2 :as head) (1 0))", "the batch is not its first axis alone"),
    ("(reshape (linear x :out 3 :as head) (2 3))", "the model does not build with 4 records"),
])
def test_a_model_that_combines_records_keeps_the_run_unstacked(body, reason):
    text = PLAIN.replace("(linear (tanh (linear x :out 5 :as fc)) :out 3 :as head)", body)
    if "transpose" in body:
        text = text.replace("(cross-entropy y)", "(mse y)")
    program = compile_program(experiment(text), SPECS if "transpose" not in body else {"x": ((3,), "f32"), "y": ((2,), "f32")})
    reasons = stacking_blockers(program)
    assert any(reason in text for text in reasons), reasons
    with pytest.raises(StackingRefused):
        stack_training(program.training, 2)


def test_one_microbatch_a_step_does_not_stack():
    assert stacking_blockers(_program(PLAIN.replace(":microbatches 4", ""))) == ["the step has one microbatch"]


GENERATED = """
(defgenerator teacher :width 3
  (let w (normal (width 2)))
  (let x (normal (batch width) :salt (:step :trip)))
  (record :x x :y (matmul x w)))
(defgraph net (x) (linear x :out 2 :as fc))
(defrun r :seed 4 :data (generator teacher) :model (net x) :loss (mse y)
  :optimizer (sgd :lr 0.1) :batch 3 :microbatches 4 :steps 1)
"""


def test_a_generator_stacks_with_the_training_degree():
    program = compile_program(experiment(GENERATED))
    assert stacking_blockers(program) == []
    interpreter = Interpreter()
    one = interpreter.run(program.generator, {"step": np.int32(2), "trip": np.int32(0)})
    stacked = stack_generator(program, 4)
    four = interpreter.run(stacked, {"step": np.int32(2), "trip": np.int32(0)})
    for name, value in one.items():
        assert four[name].shape == (4 * 3,) + value.shape[1:]
        np.testing.assert_array_equal(four[name].view(np.uint32), np.concatenate([value] * 4).view(np.uint32))


@pytest.mark.parametrize("original, change, reason", [
    (":salt (:step :trip)", ":salt (:step :microbatch)", "the generator: a draw is salted with :microbatch"),
    (":y (matmul x w)", ":y (cast (cast (matmul x w) bf16) f32)", "the generator has bf16 nodes"),
])
def test_a_generator_that_differs_per_microbatch_or_rounds_to_bf16_keeps_the_run_unstacked(original, change, reason):
    program = compile_program(experiment(GENERATED.replace(original, change)))
    assert reason in " ".join(stacking_blockers(program))
