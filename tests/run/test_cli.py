"""The command line end to end: help, selection, runs that repeat their bits, losses that fall."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def sexpgpu(*args, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    environment = dict(os.environ, **(env or {}))
    environment.pop("SEXPGPU_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=900)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_losses(run_dir: Path) -> list[float]:
    return [record["loss"] for record in metrics(run_dir) if "loss" in record and "digest" in record]


def test_help_lists_every_command():
    result = sexpgpu("--help")
    assert result.returncode == 0
    for command in ("run", "check", "checkpoint"):
        assert command in result.stdout


@pytest.mark.parametrize("command", ["run", "check", "checkpoint"])
def test_each_command_has_complete_help(command):
    result = sexpgpu(command, "--help")
    assert result.returncode == 0
    assert "usage: sexpgpu " + command in result.stdout
    if command == "run":
        for flag in ("--run-dir", "--device", "--resume", "--checkpoint-to", "SELECTION"):
            assert flag in result.stdout


def test_no_command_prints_help_and_fails():
    result = sexpgpu()
    assert result.returncode == 2
    assert "run" in result.stdout


def test_missing_file_is_a_clear_error_without_traceback(tmp_path):
    result = sexpgpu("run", str(tmp_path / "absent.sexp"))
    assert result.returncode == 2
    assert "E-FILE-001" in result.stderr
    assert "Traceback" not in result.stderr


def test_selection_picks_one_of_several_runs(tmp_path):
    source = (EXAMPLES / "tiny-adam.sexp").read_text().replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    second = source[source.index("(defrun"):].replace("(defrun tiny-adam", "(defrun tiny-sgd").replace(
        "(adam :lr 0.01)", "(sgd :lr 0.1)").replace(":steps 200", ":steps 3")
    path = tmp_path / "two.sexp"
    path.write_text(source.replace(":steps 200", ":steps 3") + "\n" + second)
    unselected = sexpgpu("run", str(path), "--run-dir", str(tmp_path / "none"))
    assert unselected.returncode == 2
    assert "tiny-adam" in unselected.stderr and "tiny-sgd" in unselected.stderr
    unknown = sexpgpu("run", str(path), "tiny-sdg", "--run-dir", str(tmp_path / "none"))
    assert unknown.returncode == 2 and "tiny-sgd" in unknown.stderr
    chosen = sexpgpu("run", str(path), "tiny-sgd", "--device", "cpu", "--run-dir", str(tmp_path / "sgd"))
    assert chosen.returncode == 0, chosen.stderr
    resolved = json.loads((tmp_path / "sgd" / "experiment.json").read_text())
    assert "tiny-sgd" in json.dumps(resolved)
    assert len(step_losses(tmp_path / "sgd")) == 3


def test_tiny_adam_repeats_its_bits_and_its_loss_falls(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for run_dir in (first, second):
        result = sexpgpu("run", "examples/tiny-adam.sexp", "--device", "cpu", "--run-dir", str(run_dir))
        assert result.returncode == 0, result.stderr
    report = (first / "report.txt").read_text()
    assert "determinism" in report and "choices" in report
    assert (first / "metrics.jsonl").read_bytes() == (second / "metrics.jsonl").read_bytes()
    losses = step_losses(first)
    assert len(losses) == 200
    assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:20]) / 20
    records = metrics(first)
    assert all(len(record["digest"]) == 64 for record in records if "digest" in record)
    assert any("eval/loss" in record for record in records)


@pytest.mark.slow
def test_char_lm_loss_falls(tmp_path):
    # The example for 30 of its 200 steps: the mean loss of the last 10 steps is then 2.06
    # below the first 10's (5.24 to 3.18). The CPU interpreter's bits, and so these losses,
    # are the same on every machine (determinism level 2), so the margin is not luck.
    file = tmp_path / "char-lm.sexp"
    file.write_text((EXAMPLES / "char-lm.sexp").read_text().replace(":steps 200", ":steps 30"))
    result = sexpgpu("run", str(file), "--device", "cpu", "--run-dir", str(tmp_path / "lm"))
    assert result.returncode == 0, result.stderr
    losses = step_losses(tmp_path / "lm")
    assert len(losses) == 30
    assert losses[0] > 5.0  # about ln 256 at the start
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 1.5


def test_generator_example_trains(tmp_path):
    result = sexpgpu("run", "examples/teacher-student.sexp", "--device", "cpu", "--run-dir", str(tmp_path / "ts"))
    assert result.returncode == 0, result.stderr
    losses = step_losses(tmp_path / "ts")
    assert sum(losses[-10:]) < 0.5 * sum(losses[:10])


def test_plain_lines_when_output_is_not_a_terminal(tmp_path):
    result = sexpgpu("run", "examples/tiny-adam.sexp", "--device", "cpu", "--run-dir", str(tmp_path / "t"))
    assert result.returncode == 0
    assert "\r" not in result.stderr
    assert "step 200/200" in result.stderr
    assert result.stdout.splitlines()[-2].strip().startswith("determinism")
    assert result.stdout.splitlines()[-1].strip().startswith("choices")


def test_device_cuda_without_a_gpu_names_what_is_missing(tmp_path):
    from sexpgpu.backends.select import cuda_problem

    if cuda_problem() is None:
        pytest.skip("a usable GPU is present")
    result = sexpgpu("run", "examples/tiny-adam.sexp", "--device", "cuda", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2
    assert "E-DEVICE-001" in result.stderr and cuda_problem() in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_device_name_from_python():
    from sexpgpu.backends.select import select_backend
    from sexpgpu.errors import SexpgpuError

    with pytest.raises(SexpgpuError) as error:
        select_backend("tpu")
    assert error.value.code == "E-CLI-002"


def test_check_prints_the_report_without_running(tmp_path):
    result = sexpgpu("check", "examples/char-lm.sexp")
    assert result.returncode == 0, result.stderr
    assert "parameters" in result.stdout and "memory plan" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].strip().startswith("choices")
