"""`:load` in a run: the checkpoint pins the file, a changed file stops a resume with
E-LOAD-001, and the same bytes at another path resume and are named in the report."""

from __future__ import annotations

import json
import shutil

import numpy as np
from safetensors.numpy import save_file

from test_cli import EXAMPLES, sexpgpu

GRAPH = """
(defgraph mlp (x)
  (let first (param first (64 2) :load "{weights}" :tensor "encoder.first"))
  (let h (relu (matmul x (transpose first (1 0)))))
  (linear h :out 3 :as head))

(defrun loaded
  :seed 1
  :data (records "{data}")
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 32
  :steps 20
  :checkpoint 10)
"""


def write_experiment(tmp_path, weights: str):
    path = tmp_path / "loaded.sexp"
    path.write_text(GRAPH.format(weights=weights, data=EXAMPLES / "data" / "spirals.npz"))
    return path


def test_load_pins_refuse_changed_bytes_and_follow_moved_bytes(tmp_path):
    weights = tmp_path / "weights.safetensors"
    start = np.linspace(-1, 1, 128, dtype=np.float32).reshape(64, 2)
    save_file({"encoder.first": start}, str(weights))
    experiment = write_experiment(tmp_path, "weights.safetensors")  # relative to the experiment file
    run_dir = tmp_path / "run"
    result = sexpgpu("run", str(experiment), "--device", "cpu", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr
    pin = json.loads((run_dir / "step-10" / "experiment.json").read_text())["loads"][0]
    assert pin["param"] == "first" and pin["tensor"] == "encoder.first"
    assert pin["bytes"] == weights.stat().st_size and pin["version_kind"] == "sha256"

    original = weights.read_bytes()
    save_file({"encoder.first": start + 1}, str(weights))
    changed = sexpgpu("run", str(experiment), "--device", "cpu", "--run-dir", str(run_dir),
                      "--resume", str(run_dir / "step-10"))
    assert changed.returncode == 2
    assert "E-LOAD-001" in changed.stderr and "Traceback" not in changed.stderr

    moved = tmp_path / "moved" / "same.safetensors"
    moved.parent.mkdir()
    moved.write_bytes(original)
    weights.unlink()
    experiment = write_experiment(tmp_path, str(moved))
    branch = tmp_path / "branch"
    resumed = sexpgpu("run", str(experiment), "--device", "cpu", "--run-dir", str(branch),
                      "--resume", str(run_dir / "step-10"))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and str(moved) in resumed.stdout
    # The continuation repeats the uninterrupted run's steps 11 to 20 bit for bit.
    tail = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] > 10]
    assert (branch / "metrics.jsonl").read_text().splitlines() == tail
