"""`sexpgpu replay` through `main()`: an honest checkpoint replays to the logged bits; a
tampered log or tampered parameters are named at their step; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_choosing import SPLIT, home, line, sexpgpu, tiny  # noqa: F401  (fixtures)
from test_diff import plant_one_ulp, run_a  # noqa: F401  (fixture)
from fake_device import FakeDevice


def test_an_honest_checkpoint_replays_to_the_logged_bits(sexpgpu, run_a):
    code, out, err = sexpgpu("replay", run_a / "step-3", "--device", "cpu")
    assert code == 0, err
    assert f"replayed steps 4..6 from {run_a / 'step-3'}: every step's loss bits and digest match" in out
    code, out, _ = sexpgpu("replay", run_a / "step-3", "--device", "cpu", "--steps", "1")
    assert code == 0 and "replayed steps 4..4" in out
    code, out, _ = sexpgpu("replay", run_a, "--device", "cpu")  # a run directory: from its oldest checkpoint
    assert code == 0 and f"replayed steps 4..6 from {run_a / 'step-3'}" in out


def test_a_tampered_log_is_named_at_its_step(sexpgpu, run_a):
    lines = (run_a / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(text) for text in lines]
    for record in records:
        if record["step"] == 5 and "loss_bits" in record:
            record["loss_bits"] = f"{int(record['loss_bits'], 16) ^ 1:08x}"  # one bit of the loss
    (run_a / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    code, out, _ = sexpgpu("replay", run_a / "step-3", "--device", "cpu")
    assert code == 1 and "step 5 differs" in out and "loss bits" in out and "digest" not in out.split("step 5")[1]


def test_tampered_parameters_are_named_at_the_first_step_after(sexpgpu, run_a, tmp_path):
    plant_one_ulp(run_a, tmp_path / "b", 3)
    (tmp_path / "b/metrics.jsonl").write_text((run_a / "metrics.jsonl").read_text())
    code, out, _ = sexpgpu("replay", tmp_path / "b/step-3", "--device", "cpu")
    assert code == 1 and "step 4 differs" in out and "digest" in out


def test_replay_is_pinned_to_the_checkpoints_choices(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice(product_seconds=SPLIT))
    device = FakeDevice(product_seconds={"ordinary": 0.1, "split-k 2": 1.0})
    code, out, err = sexpgpu("replay", tmp_path / "r/step-3", device=device)
    assert code == 0, err
    assert line(out, "determinism").startswith("2: pinned") and device.measured == []


def test_bad_input(sexpgpu, run_a, tmp_path):
    def refused(*args):
        code, _, err = sexpgpu("replay", *args, "--device", "cpu")
        assert code == 2 and "Traceback" not in err, err
        return err

    assert "E-EVAL-007" in refused(run_a / "step-3", "--steps", "4")
    assert "E-EVAL-007" in refused(run_a / "step-3", "--steps", "0")
    assert "E-EVAL-007" in refused(run_a / "step-6")
    assert "E-EVAL-006" in refused(run_a / "step-3", "--metrics", tmp_path / "none.jsonl")
    assert "E-CKPT-003" in refused(run_a / "step-4")


def test_a_checkpoint_on_s3_replays_against_the_metrics_named(sexpgpu, tiny, tmp_path, s3):
    sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "r", "--checkpoint-to", s3.uri("r"))
    code, _, err = sexpgpu("replay", s3.uri("r/step-3"), "--device", "cpu")
    assert code == 2 and "E-EVAL-006" in err and "--metrics FILE" in err
    code, out, err = sexpgpu("replay", s3.uri("r/step-3"), "--device", "cpu", "--metrics", tmp_path / "r/metrics.jsonl")
    assert code == 0 and "replayed steps 4..6" in out, err
