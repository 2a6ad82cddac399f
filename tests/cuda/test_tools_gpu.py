"""The tools that read finished runs, on a real GPU (docs/tools.md): `sexpgpu evaluate` of a
CUDA run's checkpoints on the same machine takes their choices (level 2) and repeats the eval
values the run logged inline, bit for bit; `sexpgpu replay` of 20 steps of char-lm matches the
log. Skipped where no GPU is present.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_tools_gpu.py -m gpu
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

ROOT = Path(__file__).resolve().parents[2]
CHOICE_SETTINGS = ("SEXPGPU_CHOICES", "SEXPGPU_DETERMINISTIC", "SEXPGPU_NODE_GRADIENTS")


def sexpgpu(*args, home: Path, expect: int = 0) -> str:
    environment = {key: value for key, value in os.environ.items() if key not in CHOICE_SETTINGS}
    environment.update({"PYTHONPATH": str(ROOT / "src"), "HOME": str(home)})
    done = subprocess.run([sys.executable, "-m", "sexpgpu", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env=environment, timeout=900)
    assert done.returncode == expect, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def cuda_run(tmp_path_factory) -> Path:
    """char-lm on the GPU: 40 steps, a checkpoint and a pass every 20."""
    folder = tmp_path_factory.mktemp("tools")
    text = (ROOT / "examples/char-lm.sexp").read_text().replace(":steps 200", ":steps 40")
    text = text.replace(":passes ((eval :every 50 :batches 2)))", ":passes ((eval :every 20 :batches 2))\n  :checkpoint 20)")
    (folder / "char-lm.sexp").write_text(text)
    sexpgpu("run", folder / "char-lm.sexp", "--device", "cuda", "--run-dir", folder / "r", home=folder / "home")
    return folder / "r"


def logged_evaluations(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {record["step"]: record for record in records if "digest" not in record}


def test_evaluate_on_the_same_gpu_repeats_the_inline_eval_bits_at_level_2(cuda_run):
    out = sexpgpu("evaluate", cuda_run, "--device", "cuda", home=cuda_run.parent / "home")
    printed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert printed == [logged_evaluations(cuda_run)[20], logged_evaluations(cuda_run)[40]]
    assert out.count(": determinism 2 (recorded in") == 2, out
    entries = json.loads((cuda_run / "evaluations/step-40.json").read_text())["evaluations"]
    assert entries[-1]["annotation"].endswith(": determinism 2")


def test_replay_of_20_steps_of_char_lm_matches_the_log(cuda_run):
    out = sexpgpu("replay", cuda_run / "step-20", "--steps", "20", "--device", "cuda", home=cuda_run.parent / "home")
    assert "replayed steps 21..40" in out and "every step's loss bits and digest match" in out


def test_a_cpu_evaluation_of_the_cuda_checkpoint_is_level_3(cuda_run):
    out = sexpgpu("evaluate", cuda_run / "step-20", "--device", "cpu", home=cuda_run.parent / "home")
    assert ": determinism 3 (recorded in" in out
