"""The machine's choices on a real GPU (docs/determinism.md, "On the GPU"): level 1 from the
cache, level 2 pinned to another run's record with the cache emptied, a deleted cache with
another outcome reported, and --deterministic runs that agree. Skipped where no GPU is present.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_choices_gpu.py -m gpu
(alone, without -n: the deleted-cache test holds most of the GPU's memory, and skips itself
in a session of several workers)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CHOICE_SETTINGS = ("SEXPGPU_CHOICES", "SEXPGPU_DETERMINISTIC", "SEXPGPU_NODE_GRADIENTS")


@pytest.fixture
def tiny(tmp_path) -> Path:
    """tiny-adam with :microbatches 4, so that stacking has degrees to choose among."""
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    text = text.replace(":steps 200", ":steps 30 :microbatches 4").replace(":checkpoint 100", ":checkpoint 10")
    path = tmp_path / "tiny.sexp"
    path.write_text(text)
    return path


def run(tiny, run_dir, home, *flags, env=None):
    environment = {key: value for key, value in os.environ.items() if key not in CHOICE_SETTINGS}
    environment.update({"PYTHONPATH": str(ROOT / "src"), "HOME": str(home), **(env or {})})
    done = subprocess.run([sys.executable, "-m", "sexpgpu", "run", str(tiny), "--device", "cuda", "--run-dir",
                           str(run_dir), *map(str, flags)], cwd=ROOT, capture_output=True, text=True,
                          env=environment, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def bits(run_dir: Path) -> str:
    return (run_dir / "metrics.jsonl").read_text()


def level(report: str) -> str:
    return next(line.strip()[len("determinism"):].strip() for line in report.splitlines()
                if line.strip().startswith("determinism"))


def test_a_second_run_repeats_the_first_from_the_cache(tiny, tmp_path):
    first = run(tiny, tmp_path / "a", tmp_path / "home")
    second = run(tiny, tmp_path / "b", tmp_path / "home")
    assert level(first).startswith("1: ") and level(second).startswith("1: ")
    if "chosen now" in first:
        assert "taken from" in second and "chosen now" not in second
    assert bits(tmp_path / "a") == bits(tmp_path / "b")


def test_a_run_pinned_to_another_runs_record_repeats_its_bits_with_the_cache_emptied(tiny, tmp_path):
    run(tiny, tmp_path / "theirs", tmp_path / "home")
    shutil.rmtree(tmp_path / "home")
    report = run(tiny, tmp_path / "mine", tmp_path / "home", "--choices", tmp_path / "theirs/experiment.json")
    assert level(report).startswith("2: pinned to the choices of")
    # a pinned run remembers no choice (the generated kernels' source cache is not one)
    assert not (tmp_path / "home/.cache/sexpgpu/choices.json").exists()
    assert not (tmp_path / "home/.cache/sexpgpu/cost").exists()
    assert bits(tmp_path / "mine") == bits(tmp_path / "theirs")


def test_a_deleted_cache_and_another_outcome_are_reported(tiny, tmp_path):
    """Another process takes most of the free memory, so fewer stacking degrees fit. It
    takes the memory from every test beside it too, so it runs only in a session of one
    worker (this file alone, without -n)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip("holds 97% of the GPU's free memory, which the tests of the other workers need: "
                    "run this file alone, without -n")
    first = run(tiny, tmp_path / "a", tmp_path / "home")
    if "stacking degrees" not in first:
        pytest.skip("this CUDA backend offers no DeviceProbe yet, so it measures nothing")
    shutil.rmtree(tmp_path / "home")
    free, _ = torch.cuda.mem_get_info()
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time, torch; x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, "
                               "device='cuda'); print('held', flush=True); time.sleep(600)", str(int(free * 0.97))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        time.sleep(1)
        second = run(tiny, tmp_path / "b", tmp_path / "home")
    finally:
        holder.kill()
        holder.wait()
    assert "chosen now" in second
    offered = [line for line in second.splitlines() if "stacking degrees" in line]
    assert offered != [line for line in first.splitlines() if "stacking degrees" in line]  # less memory is free


def test_deterministic_runs_agree_bit_for_bit(tiny, tmp_path):
    reports = [run(tiny, tmp_path / name, tmp_path / f"home-{name}", "--deterministic") for name in ("a", "b")]
    assert all(level(report).startswith("2: --deterministic") for report in reports)
    assert bits(tmp_path / "a") == bits(tmp_path / "b")
