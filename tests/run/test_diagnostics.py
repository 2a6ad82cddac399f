"""The diagnostics selection (docs/tools.md, "Diagnostics"): a diagnosed run logs diag/* on
its sampled steps, with figures checked against float64 numpy from the checkpoints and the
step's own records; the interpreter's training bits stay the undiagnosed run's; a resume
repeats every line; the selection is part of the run's identity."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sexpgpu.lang.forms import load_experiment
from sexpgpu.run.setup import build_run
from sexpgpu.store import read_checkpoint

from test_choosing import home, sexpgpu, tiny  # noqa: F401  (fixtures)
from test_cli import metrics

LAYERS = ("fc1", "fc2", "head")


@pytest.fixture
def diagnosed(tiny) -> Path:
    """tiny-adam, 6 steps, a checkpoint every step, diagnostics every 2."""
    text = tiny.read_text().replace(":checkpoint 3", ":checkpoint 1\n  :diagnostics (every 2)")
    path = tiny.with_name("diagnosed.sexp")
    path.write_text(text)
    return path


def diag_lines(run_dir: Path) -> dict:
    return {record["step"]: record for record in metrics(run_dir) if any(key.startswith("diag/") for key in record)}


def forward(params: dict, x: np.ndarray) -> dict:
    """The mlp's layers in float64: the oracle of the activations and the head's gradient."""
    fc1 = x @ params["fc1/w"].T + params["fc1/b"]
    fc2 = np.maximum(fc1, 0) @ params["fc2/w"].T + params["fc2/b"]
    head = np.maximum(fc2, 0) @ params["head/w"].T + params["head/b"]
    return {"fc1": fc1, "fc2": fc2, "head": head}


def test_a_diagnosed_run_logs_its_statistics_on_the_sampled_steps(sexpgpu, diagnosed, tmp_path):
    code, out, err = sexpgpu("run", diagnosed, "--device", "cpu", "--run-dir", tmp_path / "r")
    assert code == 0, err
    assert "a diagnosed step's bits may differ from an undiagnosed run's" in out
    lines = diag_lines(tmp_path / "r")
    assert sorted(lines) == [2, 4, 6]
    record = lines[6]
    before = {name[len("param/"):]: value.astype(np.float64)
              for name, value in read_checkpoint(str(tmp_path / "r/step-5")).tensors.items() if name.startswith("param/")}
    after = {name[len("param/"):]: value.astype(np.float64)
             for name, value in read_checkpoint(str(tmp_path / "r/step-6")).tensors.items() if name.startswith("param/")}
    for path in before:
        expected = np.linalg.norm(after[path] - before[path]) / np.linalg.norm(before[path])
        assert record[f"diag/update_ratio/{path}"] == pytest.approx(expected, rel=1e-12)
    batch = build_run(load_experiment(diagnosed), "cpu").feeder.train_batch(6, 0)
    x, y = batch["field/x"].astype(np.float64), batch["field/y"]
    layers = forward(before, x)
    for layer in LAYERS:
        values = layers[layer]
        assert record[f"diag/act/{layer}/mean"] == pytest.approx(values.mean(), rel=1e-4, abs=1e-6)
        assert record[f"diag/act/{layer}/rms"] == pytest.approx(np.sqrt((values ** 2).mean()), rel=1e-5)
        assert record[f"diag/act/{layer}/max_abs"] == pytest.approx(np.abs(values).max(), rel=1e-5)
        assert record[f"diag/act/{layer}/zero_fraction"] == 0.0 and record[f"diag/act/{layer}/nonfinite"] == 0
    logits = layers["head"]
    softmax = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    head_bias_grad = (softmax - np.eye(3)[y]).mean(axis=0)  # the mean cross-entropy's gradient
    assert record["diag/grad_norm/head/b"] == pytest.approx(np.linalg.norm(head_bias_grad), rel=1e-5)


def test_the_interpreters_training_bits_stay_the_undiagnosed_runs(sexpgpu, diagnosed, tmp_path):
    sexpgpu("run", diagnosed, "--device", "cpu", "--run-dir", tmp_path / "d")
    plain = diagnosed.with_name("plain.sexp")
    plain.write_text(diagnosed.read_text().replace("\n  :diagnostics (every 2)", ""))
    sexpgpu("run", plain, "--device", "cpu", "--run-dir", tmp_path / "p")
    code, out, _ = sexpgpu("diff", tmp_path / "d", tmp_path / "p", "--json")
    found = json.loads(out)
    assert code == 0 and found["identical"] is True
    assert ["experiment.run.diagnostics.every", 2, None] in found["records"]
    recorded = json.loads((tmp_path / "d/step-2/experiment.json").read_text())
    assert recorded["experiment"]["resolved"]["run"]["diagnostics"] == {"every": 2}
    assert "diagnostics" not in json.loads((tmp_path / "p/step-2/experiment.json").read_text())["experiment"]["resolved"]["run"]


def test_a_resume_repeats_every_line_and_keeps_the_selection(sexpgpu, diagnosed, tmp_path):
    sexpgpu("run", diagnosed, "--device", "cpu", "--run-dir", tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for later in ("step-4", "step-5", "step-6"):
        shutil.rmtree(tmp_path / "b" / later)
    code, _, err = sexpgpu("run", diagnosed, "--device", "cpu", "--run-dir", tmp_path / "b", "--resume", "latest")
    assert code == 0, err
    assert (tmp_path / "b/metrics.jsonl").read_text() == (tmp_path / "a/metrics.jsonl").read_text()
    diagnosed.write_text(diagnosed.read_text().replace(":diagnostics (every 2)", ":diagnostics (every 3)"))
    code, _, err = sexpgpu("run", diagnosed, "--device", "cpu", "--run-dir", tmp_path / "a", "--resume", "step-3")
    assert code == 2 and "diagnostics" in err


def test_replay_and_evaluate_of_a_diagnosed_run(sexpgpu, diagnosed, tmp_path):
    sexpgpu("run", diagnosed, "--device", "cpu", "--run-dir", tmp_path / "r")
    code, out, _ = sexpgpu("replay", tmp_path / "r/step-1", "--device", "cpu")
    assert code == 0 and "replayed steps 2..6" in out


def test_a_stacked_run_diagnoses_its_first_microbatch_beside_its_stacked_calls(sexpgpu, diagnosed, tmp_path):
    from fake_device import FakeDevice

    stacked = diagnosed.with_name("stacked.sexp")
    stacked.write_text(diagnosed.read_text().replace(":batch 64", ":batch 32 :microbatches 2"))
    prefers_two = FakeDevice(step_seconds={1: 1.0, 2: 0.1})
    code, out, err = sexpgpu("run", stacked, "--run-dir", tmp_path / "s", device=prefers_two)
    assert code == 0 and "stacking 2" in out, err
    plain = stacked.with_name("stacked-plain.sexp")
    plain.write_text(stacked.read_text().replace("\n  :diagnostics (every 2)", ""))
    sexpgpu("run", plain, "--run-dir", tmp_path / "p", device=FakeDevice(step_seconds={1: 1.0, 2: 0.1}))
    assert sorted(diag_lines(tmp_path / "s")) == [2, 4, 6]
    steps = [record for record in metrics(tmp_path / "s") if "digest" in record]
    assert steps == [record for record in metrics(tmp_path / "p") if "digest" in record]
    # the statistics are the first microbatch's (32 records): its fc1 activation has 32 x 64 elements
    record = diag_lines(tmp_path / "s")[6]
    assert {key.split("/")[2] for key in record if key.startswith("diag/act/")} == set(LAYERS)
    before = {name[len("param/"):]: value.astype(np.float64)
              for name, value in read_checkpoint(str(tmp_path / "s/step-5")).tensors.items() if name.startswith("param/")}
    x = build_run(load_experiment(stacked), "cpu").feeder.train_batch(6, 0)["field/x"].astype(np.float64)
    assert x.shape == (32, 2)
    assert record["diag/act/fc1/rms"] == pytest.approx(np.sqrt((forward(before, x)["fc1"] ** 2).mean()), rel=1e-5)
