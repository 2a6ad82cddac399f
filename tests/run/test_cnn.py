"""The CNN example end to end: it trains on the CPU interpreter, its bits do not depend on how
many threads the interpreter uses, and on a GPU it trains too."""

from __future__ import annotations

import pytest

from test_cli import metrics, sexpgpu, step_losses


def _falls(losses: list) -> bool:
    return sum(losses[-20:]) / 20 < 0.3 * sum(losses[:20]) / 20


def test_cnn_trains_on_the_interpreter_with_the_same_bits_on_one_thread_or_several(tmp_path):
    threaded, single = tmp_path / "threaded", tmp_path / "single"
    for run_dir, threads in ((threaded, "2"), (single, "1")):
        result = sexpgpu("run", "examples/cnn.sexp", "--device", "cpu", "--run-dir", str(run_dir),
                         env={"SEXPGPU_CPU_THREADS": threads})
        assert result.returncode == 0, result.stderr
    losses = step_losses(threaded)
    assert len(losses) == 120
    assert losses[0] == pytest.approx(0.693, abs=0.05)  # two classes, ln 2 at the start
    assert _falls(losses)
    final = [record for record in metrics(threaded) if "eval/accuracy" in record][-1]
    assert final["eval/accuracy"] > 0.9
    assert (threaded / "metrics.jsonl").read_bytes() == (single / "metrics.jsonl").read_bytes()


@pytest.mark.gpu
def test_cnn_trains_on_the_gpu(tmp_path):
    result = sexpgpu("run", "examples/cnn.sexp", "--device", "cuda", "--run-dir", str(tmp_path / "gpu"))
    assert result.returncode == 0, result.stderr
    assert _falls(step_losses(tmp_path / "gpu"))
