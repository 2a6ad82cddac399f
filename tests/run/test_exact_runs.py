"""Runs under `:arithmetic exact` on the CPU interpreter: the setting, its refusals, and
stacking degrees 1, 2 and 4 giving the same bits for every step (loss, gradient norm,
parameters and optimizer state): tiny-adam at 1, 2 and 4, a small char-lm (embedding,
layernorm, attention) and the CNN example (convolutions, pooling) at 1 and 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.select import cuda_problem, run_facts, select_backend  # noqa: E402
from sexpgpu.cli.main import main  # noqa: E402
from sexpgpu.errors import SexpgpuError  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402
from sexpgpu.graph.passes.exact_region import exact_graph  # noqa: E402
from sexpgpu.lang.forms import parse_experiment, select_run  # noqa: E402
from sexpgpu.lang.serialize import experiment_to_json  # noqa: E402
from sexpgpu.lang.reader import read_text  # noqa: E402
from sexpgpu.run.choosing import stacked_training  # noqa: E402
from sexpgpu.run.loop import Stacking, Trainer  # noqa: E402
from sexpgpu.run.setup import build_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY_ADAM = ROOT / "examples" / "tiny-adam.sexp"
CHAR_LM = ROOT / "examples" / "char-lm.sexp"
CNN = ROOT / "examples" / "cnn.sexp"

# char-lm and the CNN cut down so that an exact step takes a few seconds on two cores
SMALL_CHAR_LM = {":context 64 :width 64 :heads 4 :ff 256 :layers 2": ":context 8 :width 16 :heads 2 :ff 32 :layers 1",
                 ":width 64 :heads 4 :ff 256": ":width 16 :heads 2 :ff 32", "(text pydoc :context 64)":
                 "(text pydoc :context 8)", ":batch 16": ":batch 2 :microbatches 2 :arithmetic exact"}


def experiment(path: Path, edits: dict):
    text = path.read_text()
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    return select_run(parse_experiment(read_text(text, str(path)), str(path), ""), None)


def exact_tiny_adam():
    return experiment(TINY_ADAM, {":batch 64": ":batch 16 :microbatches 4 :arithmetic exact"})


def steps_at(chosen, degree: int, steps: int) -> tuple:
    """(step records, the final parameters and optimizer state as host arrays) at `degree`."""
    built = build_run(chosen, "cpu")
    trainer = Trainer(chosen.run, built.program, built.backend, built.feeder,
                      Stacking(stacked_training(built.program, degree), degree))
    state = built.initial_state()
    records = [trainer.step(state) for _ in range(steps)]
    return records, {**state.params, **state.optimizer}


def bits(values: dict) -> dict:
    return {name: np.asarray(value).tobytes() for name, value in values.items()}


@pytest.mark.slow
def test_tiny_adam_at_stacking_1_2_and_4_has_the_same_bits_at_every_step():
    chosen = exact_tiny_adam()
    unstacked, final = steps_at(chosen, 1, 2)
    for degree in (2, 4):
        stacked, stacked_final = steps_at(chosen, degree, 2)
        assert stacked == unstacked, degree  # loss bits, grad norm and the parameters' digest, step by step
        assert bits(stacked_final) == bits(final)


@pytest.mark.slow
def test_a_small_char_lm_stacked_2_has_the_unstacked_bits():
    chosen = experiment(CHAR_LM, SMALL_CHAR_LM)
    unstacked, final = steps_at(chosen, 1, 1)
    stacked, stacked_final = steps_at(chosen, 2, 1)
    assert stacked == unstacked and bits(stacked_final) == bits(final)


def test_the_setting_is_in_the_resolved_experiment_only_when_exact():
    assert json.loads(json.dumps(experiment_to_json(exact_tiny_adam())))["run"]["arithmetic"] == "exact"
    plain = experiment(TINY_ADAM, {})
    assert "arithmetic" not in experiment_to_json(plain)["run"] and plain.run.arithmetic == "float"


@pytest.mark.parametrize("edit, message", [
    (":arithmetic fast", ":arithmetic must be one of float, exact, found fast."),
    (":arithmetic exact :precision bf16", ":arithmetic exact computes in float32"),
])
def test_an_unknown_arithmetic_or_one_with_bf16_is_refused(edit, message):
    with pytest.raises(SexpgpuError) as refused:
        experiment(TINY_ADAM, {":batch 64": ":batch 64 " + edit})
    assert refused.value.code == "E-FORM-011" and message in refused.value.message


def test_a_gradient_that_would_round_between_its_sums_is_refused_at_compile_time(tmp_path, capsys):
    text = TINY_ADAM.read_text().replace(":batch 64", ":batch 64 :arithmetic exact").replace(
        "(defgraph mlp (x) :hidden 64 :classes 3",
        "(defgraph mlp (x) :hidden 64 :classes 3\n  (let s (param s (3) :init ones))")
    text = text.replace("(linear h2 :out classes :as head))", "(mul (linear h2 :out classes :as head) (mul s s)))")
    text = text.replace('"data/spirals.npz"', f'"{ROOT / "examples" / "data" / "spirals.npz"}"')
    assert "(mul s s)" in text
    path = tmp_path / "squared.sexp"
    path.write_text(text)
    assert main(["check", str(path)]) == 2
    said = capsys.readouterr().err
    assert "squared.sexp:" in said and "error E-EXACT-002" in said and "grad/s" in said and "'mul'" in said
    print(said)


def test_without_a_gpu_auto_takes_the_exact_interpreter_and_states_the_exact_lines():
    if cuda_problem() is None:
        pytest.skip("a GPU is present: auto takes it (tests/cuda/test_exact_mode_gpu.py)")
    with pytest.raises(SexpgpuError) as refused:
        select_backend("cuda")
    assert refused.value.code == "E-DEVICE-001"
    backend, facts = select_backend("auto")
    facts = run_facts(facts, "exact")
    assert backend.name == "cpu"
    assert facts["determinism"].startswith("exact on every device: ")
    assert "no stacking degree or GPU count changes a bit" in facts["choices"]


def test_without_torch_an_exact_run_is_refused_with_a_code(monkeypatch):
    monkeypatch.setitem(sys.modules, "sexpgpu.backends.cpu.exact_kernels", None)  # its import fails as without torch
    e = Emitter()
    a = e.input("a", "f32", (2, 2))
    graph = exact_graph(e.graph({"a": a}, {"y": e("matmul", a, a)}))
    with pytest.raises(SexpgpuError) as refused:
        Interpreter().run(graph, {"a": np.ones((2, 2), np.float32)})
    assert refused.value.code == "E-EXACT-001" and "needs PyTorch" in refused.value.message


@pytest.mark.slow
def test_the_cnn_example_stacked_2_has_the_unstacked_bits():
    chosen = experiment(CNN, {":batch 32": ":batch 4 :microbatches 2 :arithmetic exact"})
    unstacked, final = steps_at(chosen, 1, 1)
    stacked, stacked_final = steps_at(chosen, 2, 1)
    assert stacked == unstacked and bits(stacked_final) == bits(final)


def test_an_exact_checkpoint_resumes_with_the_uninterrupted_bits_and_not_as_a_float_run(tmp_path, capsys):
    text = (tmp_path / "fit.sexp")
    text.write_text(EXACT_FIT)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["run", str(text), "--run-dir", str(whole)]) == 0
    text.write_text(EXACT_FIT.replace(":steps 4", ":steps 4 :checkpoint 2"))
    assert main(["run", str(text), "--run-dir", str(cut)]) == 0
    resumed = tmp_path / "resumed"
    assert main(["run", str(text), "--run-dir", str(resumed), "--resume", str(cut / "step-2")]) == 0
    steps = [line for line in (whole / "metrics.jsonl").read_text().splitlines() if '"digest"' in line]
    again = [line for line in (resumed / "metrics.jsonl").read_text().splitlines() if '"digest"' in line]
    assert [json.loads(line) for line in again] == [json.loads(line) for line in steps[2:]]
    text.write_text(EXACT_FIT.replace(":steps 4", ":steps 4 :checkpoint 2").replace(" :arithmetic exact", ""))
    capsys.readouterr()
    assert main(["run", str(text), "--run-dir", str(tmp_path / "float"), "--resume", str(cut / "step-2")]) == 2
    said = capsys.readouterr().err
    assert "E-CKPT-002" in said and "arithmetic" in said


@pytest.mark.parametrize("arithmetic", ["exact", "float"])
def test_a_checkpoint_another_device_wrote_resumes_only_in_an_exact_run(tmp_path, capsys, monkeypatch, arithmetic):
    """The device is no part of an exact checkpoint's identity: one the CUDA backend wrote (the
    checkpoint's `device` says cuda) resumes on the CPU; a float run's is E-CKPT-002."""
    import sexpgpu.run.setup as setup

    text = EXACT_FIT.replace(":steps 4", ":steps 4 :checkpoint 2")
    if arithmetic == "float":
        text = text.replace(" :arithmetic exact", "")
    path = tmp_path / "fit.sexp"
    path.write_text(text)

    def written_on_cuda(device, gpu=None):
        backend, facts = select_backend("cpu")
        return backend, {**facts, "kind": "cuda"}

    with monkeypatch.context() as patched:
        patched.setattr(setup, "select_backend", written_on_cuda)
        assert main(["run", str(path), "--run-dir", str(tmp_path / "gpu")]) == 0
    capsys.readouterr()
    status = main(["run", str(path), "--run-dir", str(tmp_path / "cpu"), "--resume", str(tmp_path / "gpu" / "step-2")])
    if arithmetic == "float":
        said = capsys.readouterr().err
        assert status == 2 and "E-CKPT-002" in said and 'device: checkpoint "cuda", now "cpu"' in said
        return
    assert status == 0
    steps = (tmp_path / "gpu" / "metrics.jsonl").read_text().splitlines()[2:]
    assert (tmp_path / "cpu" / "metrics.jsonl").read_text().splitlines() == steps


def test_a_pin_holds_nothing_in_an_exact_run(tmp_path, capsys):
    """--choices names a record with stacking 2 (which a float run on the interpreter refuses,
    E-CHOICE-001): an exact run takes no choices, so it runs, at the exact level."""
    path = tmp_path / "fit.sexp"
    path.write_text(EXACT_FIT)
    record = tmp_path / "choices.json"
    record.write_text(json.dumps({"choices": {"device": "compute_90 with 132 multiprocessors", "strict": False,
                                              "stacking": 2, "recompute": 9.0, "convolutions": {}}}))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run"), "--choices", str(record)]) == 0
    assert "exact on every device" in capsys.readouterr().out


EXACT_FIT = """
(defgenerator pairs
  (let x (normal (batch 4) :salt (:step :trip)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph fit (x) (linear x :out 1 :as fc))
(defrun exact-fit :seed 3 :data (generator pairs) :model (fit x) :loss (mse y)
  :optimizer (adam :lr 0.01) :arithmetic exact :batch 8 :microbatches 4 :steps 4)
"""
