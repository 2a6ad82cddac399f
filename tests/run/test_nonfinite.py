"""A step whose loss is NaN or infinite stops the run (E-NUM-001) before its update, naming
the first value that was not finite; the last good checkpoint and the metrics log stay as
they were. SEXPGPU_NONFINITE=continue goes on instead. No numpy warning reaches the terminal
either way."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sexpgpu.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SPIRALS = ROOT / "examples" / "data" / "spirals.npz"


def diverging(tmp_path: Path) -> Path:
    """tiny-adam at a learning rate of 1e30: step 1's loss is finite, step 2's NaN. Its layers
    are wide enough for the interpreter to split their kernels over threads."""
    text = (ROOT / "examples" / "tiny-adam.sexp").read_text().replace('"data/spirals.npz"', f'"{SPIRALS}"')
    for old, new in (("(adam :lr 0.01)", "(adam :lr 1e30)"), (":hidden 64", ":hidden 256"), (":batch 64", ":batch 256"),
                     (":steps 200", ":steps 4"), (":checkpoint 100", ":checkpoint 1")):
        text = text.replace(old, new)
    path = tmp_path / "diverging.sexp"
    path.write_text(text)
    return path


def sexpgpu(*args, env: dict) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT / "src"), SEXPGPU_CPU_THREADS="2", **env)
    environment.pop("SEXPGPU_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=300)


def records(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_no_warning(stderr: str) -> None:
    assert "Warning" not in stderr and "src/sexpgpu" not in stderr and "Traceback" not in stderr, stderr


def test_a_diverging_run_stops_at_its_first_nonfinite_loss_and_keeps_its_last_good_checkpoint(tmp_path):
    run_dir, path = tmp_path / "run", diverging(tmp_path)
    result = sexpgpu("run", str(path), "--device", "cpu", "--run-dir", str(run_dir), env={})
    assert result.returncode == 2, result.stderr
    assert_no_warning(result.stderr)
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error E-NUM-001: step 2's loss is not finite (nan, microbatch 0)")
    # the first value in graph order that is not finite, with its place in the file: fc1's values
    # are about 1e29 after step 1's update, their products in fc2 overflow
    assert f"the first value that is not finite, in graph order, is matmul in fc2 at {path}:7:17 (f32[256 256]:" \
        in error
    assert "stopped before its update, so the parameters are those after step 1" in error
    assert "the metrics log ends with step 1" in error
    assert f"The last good checkpoint is {run_dir / 'step-1'} (step 1)" in error
    assert [record["step"] for record in records(run_dir)] == [1]
    assert (run_dir / "step-1").is_dir() and not (run_dir / "step-2").exists()


def test_with_SEXPGPU_NONFINITE_continue_a_diverging_run_goes_on_without_a_warning(tmp_path):
    run_dir = tmp_path / "run"
    result = sexpgpu("run", str(diverging(tmp_path)), "--device", "cpu", "--run-dir", str(run_dir),
                     env={"SEXPGPU_NONFINITE": "continue"})
    assert result.returncode == 0, result.stderr
    assert_no_warning(result.stderr)
    losses = [record["loss"] for record in records(run_dir) if "digest" in record]
    assert len(losses) == 4 and losses[0] == losses[0] and all(loss != loss for loss in losses[1:])
    assert (run_dir / "step-4").is_dir()


OVERFLOW = """
(defgraph blow (x)
  (linear (exp (mul (linear x :out 8 :as fc1) 1000.0)) :out 3 :as head))
(defrun blow
  :seed 1
  :data (records "{data}")
  :model (blow x)
  :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1)
  :batch 16
  :microbatches 2
  :steps 2
  :checkpoint 1)
"""


def test_the_first_nonfinite_value_is_named_with_its_place_in_the_file(tmp_path, capsys):
    path = tmp_path / "blow.sexp"
    path.write_text(OVERFLOW.format(data=SPIRALS))
    assert main(["run", str(path), "--device", "cpu", "--run-dir", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error E-NUM-001: step 1's loss is not finite")
    assert f"is exp at {path}:3:11 (f32[16 8]:" in error  # the product before it is large but finite
    assert "No checkpoint was written" in error
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""


SGD_OVERFLOW = """
(defgenerator line :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (mul (reshape (sum x :axis 1) (batch 1)) 100.0)))
(defgraph fit (x) (linear x :out 1 :as fc))
(defrun overflow
  :seed 3
  :data (generator line)
  :model (fit x)
  :loss (mse y)
  :optimizer (sgd :lr 3e38)
  :batch 8
  :steps 3
  :checkpoint {every})
"""


def overflow(tmp_path: Path, capsys, every: int) -> str:
    """The last line of a run whose step 1 has a finite loss but overflows the parameters."""
    path = tmp_path / "overflow.sexp"
    path.write_text(SGD_OVERFLOW.format(every=every))
    assert main(["run", str(path), "--device", "cpu", "--run-dir", str(tmp_path / "run")]) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_no_checkpoint_holds_parameters_that_are_not_finite(tmp_path, capsys):
    error = overflow(tmp_path, capsys, every=1)
    assert error.startswith("error E-NUM-001: after step 1 the parameter fc/")
    assert "not finite" in error and "no checkpoint of step 1 was written" in error
    assert not (tmp_path / "run" / "step-1").exists()
    assert [record["step"] for record in records(tmp_path / "run")] == [1]


def test_a_parameter_made_nonfinite_by_the_step_before_is_named_as_the_first_value(tmp_path, capsys):
    error = overflow(tmp_path, capsys, every=2)
    assert error.startswith("error E-NUM-001: step 2's loss is not finite")
    assert re.search(r"is the parameter fc/\w \(f32\[[\d ]+\]: \d+ of \d+ values NaN or infinite\), an input of the "
                     r"step: step 1's update made it so", error), error


@pytest.mark.gpu
def test_on_a_gpu_the_first_nonfinite_value_is_named_too(tmp_path, capsys):
    path = tmp_path / "blow.sexp"
    path.write_text(OVERFLOW.format(data=SPIRALS))
    assert main(["run", str(path), "--device", "cuda", "--run-dir", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error E-NUM-001: step 1's loss is not finite")
    assert f"is exp at {path}:3:11 (f32[16 8]:" in error
