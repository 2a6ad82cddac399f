"""The interpreter's bits do not depend on its thread count: a few steps of the char-lm
example, whose products, sums and elementwise functions are all large enough to be split
across threads, give the same metrics (losses, gradient norms, parameter digests) on one
thread and on two."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(experiment: Path, run_dir: Path, threads: str) -> bytes:
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "SEXPGPU_CPU_THREADS": threads}
    done = subprocess.run([sys.executable, "-m", "sexpgpu", "run", str(experiment), "--device", "cpu",
                           "--run-dir", str(run_dir)], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return (run_dir / "metrics.jsonl").read_bytes()


@pytest.mark.slow  # two runs of a few seconds each
def test_char_lm_steps_have_the_same_bits_on_one_thread_and_two(tmp_path):
    text = (ROOT / "examples" / "char-lm.sexp").read_text()
    text = text.replace(":steps 200", ":steps 3").replace("\n  :passes ((eval :every 50 :batches 2))", "")
    experiment = tmp_path / "char-lm-short.sexp"
    experiment.write_text(text)
    single = _run(experiment, tmp_path / "single", "1")
    assert single.count(b"\n") >= 3
    assert _run(experiment, tmp_path / "threaded", "2") == single
