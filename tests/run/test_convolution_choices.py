"""Convolution engines through `sexpgpu run`: the CNN example on the CPU interpreter, with
tests/fake_device.py's device standing in for a GPU whose cuDNN offers engines. Each engine is
recorded in the run directory, the lowering annotation and each checkpoint, counted on the
choices line, taken again from the cache, pinned by --choices and by a resume, and refused
with E-CHOICE-001 where the device does not offer it (determinism.md, "Pinning a run to
recorded choices")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_choosing import choices_of, home, line, sexpgpu  # noqa: F401  (home and sexpgpu: the fixtures)
from test_cli import EXAMPLES, metrics

from fake_device import H200, FakeDevice

ENGINES = {"engine 0 knobs": 1.0, "engine 7 knobs 2=1": 0.5, "engine 12 knobs 5=3 14=2": 0.8}
CONVOLUTIONS = 5  # conv1 forward and weight cotangent; conv2 forward, input and weight cotangents


@pytest.fixture
def cnn(tmp_path) -> Path:
    """The CNN example, 4 steps, a checkpoint every 2, its eval pass every 2."""
    text = (EXAMPLES / "cnn.sexp").read_text().replace(":steps 120", ":steps 4 :checkpoint 2")
    text = text.replace("(eval :every 40 :batches 4)", "(eval :every 2 :batches 1)")
    path = tmp_path / "cnn.sexp"
    path.write_text(text)
    return path


def timed(device) -> list:
    return [call for call in device.measured if call[0] == "convolution"]


def test_each_convolutions_engine_is_recorded_everywhere_and_counted(sexpgpu, cnn, tmp_path):
    device = FakeDevice(convolution_seconds=ENGINES)
    code, out, err = sexpgpu("run", cnn, "--run-dir", tmp_path / "r", device=device)
    assert code == 0, err
    recorded = choices_of(tmp_path / "r/experiment.json")["convolutions"]
    assert len(recorded) == CONVOLUTIONS and set(recorded.values()) == {"engine 7 knobs 2=1"}
    assert all(key.endswith(" f32") and " Spec { batch: 32, " in key for key in recorded)
    assert choices_of(tmp_path / "r/step-2/experiment.json")["convolutions"] == recorded
    annotation = json.loads((tmp_path / "r/lowering.json").read_text())
    assert annotation["metadata"]["choices"]["convolutions"] == recorded
    assert f"{CONVOLUTIONS} convolution engines" in line(out, "choices")
    assert len(timed(device)) == CONVOLUTIONS * len(ENGINES)
    assert any(text.startswith("  choosing") and "convolutions" in text and "chosen now" in text for text in out.splitlines())


def test_a_second_run_takes_the_engines_from_the_cache(sexpgpu, cnn, tmp_path, home):
    sexpgpu("run", cnn, "--run-dir", tmp_path / "a", device=FakeDevice(convolution_seconds=ENGINES))
    reversed_times = {text: 2.0 - seconds for text, seconds in ENGINES.items()}
    again = FakeDevice(convolution_seconds=reversed_times)
    code, out, err = sexpgpu("run", cnn, "--run-dir", tmp_path / "b", device=again)
    assert code == 0, err
    assert timed(again) == [] and f"convolutions taken from {home}/.cache/sexpgpu" in out
    assert choices_of(tmp_path / "a/experiment.json") == choices_of(tmp_path / "b/experiment.json")
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")


def test_a_run_pinned_to_the_record_times_nothing(sexpgpu, cnn, tmp_path, home):
    sexpgpu("run", cnn, "--run-dir", tmp_path / "theirs", device=FakeDevice(convolution_seconds=ENGINES))
    (home / ".cache").rename(tmp_path / "their-cache")
    mine = FakeDevice(convolution_seconds={text: 1.0 for text in ENGINES})
    code, out, err = sexpgpu("run", cnn, "--run-dir", tmp_path / "mine", "--choices",
                             tmp_path / "theirs/step-2", device=mine)
    assert code == 0, err
    assert timed(mine) == [] and not (home / ".cache").exists()
    assert choices_of(tmp_path / "mine/step-4/experiment.json")["convolutions"] == \
        choices_of(tmp_path / "theirs/experiment.json")["convolutions"]


@pytest.mark.parametrize("device, reason", [
    (FakeDevice(convolution_seconds={"engine 0 knobs": 1.0}), "cuDNN does not offer 'engine 7 knobs 2=1' here"),
    (FakeDevice(unavailable="cuDNN's frontend (nvidia-cudnn-frontend, the extra `cudnn`) is not installed"),
     "(cuDNN's frontend (nvidia-cudnn-frontend, the extra `cudnn`) is not installed)"),
])
def test_a_pinned_engine_not_offered_stops_before_the_first_step(sexpgpu, cnn, tmp_path, device, reason):
    sexpgpu("run", cnn, "--run-dir", tmp_path / "theirs", device=FakeDevice(convolution_seconds=ENGINES))
    code, _, err = sexpgpu("run", cnn, "--run-dir", tmp_path / "mine", "--choices",
                           tmp_path / "theirs/experiment.json", device=device)
    assert code == 2 and "error E-CHOICE-001" in err and "its convolutions: the convolution " in err
    assert " Spec { batch: 32, " in err and reason in err
    assert not (tmp_path / "mine/metrics.jsonl").exists()


def test_a_convolution_the_record_has_no_engine_for_stops(sexpgpu, cnn, tmp_path):
    sexpgpu("run", cnn, "--run-dir", tmp_path / "theirs", device=FakeDevice(convolution_seconds=ENGINES))
    experiment = json.loads((tmp_path / "theirs/experiment.json").read_text())
    dropped = sorted(experiment["choices"]["convolutions"])[0]
    del experiment["choices"]["convolutions"][dropped]
    (tmp_path / "fewer.json").write_text(json.dumps(experiment))
    code, _, err = sexpgpu("run", cnn, "--run-dir", tmp_path / "mine", "--choices", tmp_path / "fewer.json",
                           device=FakeDevice(convolution_seconds=ENGINES))
    assert code == 2 and "E-CHOICE-001" in err and f"the convolution {dropped} has no recorded engine" in err


def test_a_resume_keeps_its_checkpoints_engines_on_a_card_that_would_time_otherwise(sexpgpu, cnn, tmp_path):
    sexpgpu("run", cnn, "--run-dir", tmp_path / "r", device=FakeDevice(convolution_seconds=ENGINES))
    later = FakeDevice(facts=H200, convolution_seconds={"engine 0 knobs": 0.1, "engine 7 knobs 2=1": 1.0})
    code, _, err = sexpgpu("run", cnn, "--run-dir", tmp_path / "r2", "--resume", tmp_path / "r/step-2", device=later)
    assert code == 0, err
    assert timed(later) == []
    assert set(choices_of(tmp_path / "r2/step-4/experiment.json")["convolutions"].values()) == {"engine 7 knobs 2=1"}


def test_deterministic_takes_the_first_engine_offered_and_times_none(sexpgpu, cnn, tmp_path):
    device = FakeDevice(convolution_seconds=ENGINES)
    code, out, err = sexpgpu("run", cnn, "--run-dir", tmp_path / "r", "--deterministic", device=device)
    assert code == 0, err
    assert device.measured == []
    assert set(choices_of(tmp_path / "r/experiment.json")["convolutions"].values()) == {"engine 0 knobs"}


def test_without_cudnns_frontend_the_report_says_why_and_no_engine_is_recorded(sexpgpu, cnn, tmp_path):
    device = FakeDevice(unavailable="cuDNN's frontend (nvidia-cudnn-frontend, the extra `cudnn`) is not installed")
    code, out, err = sexpgpu("run", cnn, "--run-dir", tmp_path / "r", device=device)
    assert code == 0, err
    assert choices_of(tmp_path / "r/experiment.json")["convolutions"] == {}
    assert "0 convolution engines" in line(out, "choices")
    assert any(text.startswith("  choosing            convolutions: cuDNN's frontend (nvidia-cudnn-frontend, the "
                               "extra `cudnn`) is not installed, so they run PyTorch's cuDNN convolutions")
               for text in out.splitlines())


def test_an_offline_evaluation_takes_the_checkpoints_engines_for_its_passes(sexpgpu, cnn, tmp_path, monkeypatch):
    """The record holds the passes' convolutions too, so `sexpgpu evaluate` on the same kind of
    device takes them (level 2) and times nothing."""
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.plan.levels import determinism_line
    from sexpgpu.run import choosing
    from sexpgpu.run.choosing import ChoiceSettings
    from sexpgpu.tools.evaluating import evaluation_choices
    from sexpgpu.run.setup import build_run
    from sexpgpu.store import read_record

    sexpgpu("run", cnn, "--run-dir", tmp_path / "r", device=FakeDevice(convolution_seconds=ENGINES))
    device = FakeDevice(convolution_seconds={text: 1.0 for text in ENGINES})
    monkeypatch.setattr(choosing, "backend_probe", lambda backend: device)
    built = build_run(load_experiment(str(cnn)), "cpu", read_loads=False)
    chosen = evaluation_choices(built, ChoiceSettings(), read_record(str(tmp_path / "r/step-2")), "r/step-2")
    assert determinism_line(chosen.how, chosen.choices.device).startswith("2: pinned to the choices of the checkpoint")
    forward = {key for key in chosen.choices.convolutions if key.startswith("Forward ")}
    assert len(forward) == 2 and timed(device) == []
