"""`sexpgpu plot` through `main()`: the PNG it writes is opened (matplotlib's own reader) and
checked for its size and for drawn content; without matplotlib it says how to install it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from test_choosing import home, sexpgpu, tiny  # noqa: F401  (fixtures)
from test_diff import plant_one_ulp, run_a  # noqa: F401  (fixture)


def test_two_runs_draw_their_curves_and_their_difference(sexpgpu, tiny, run_a, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    plant_one_ulp(run_a, tmp_path / "b", 3)
    assert sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "b", "--resume", "latest")[0] == 0
    code, out, err = sexpgpu("plot", run_a, tmp_path / "b", "-o", tmp_path / "runs.png")
    assert code == 0 and f"wrote {tmp_path / 'runs.png'}" in out, err
    pixels = image.imread(tmp_path / "runs.png")
    assert pixels.shape[:2] == (600, 900)
    drawn = np.any(pixels[..., :3] < 0.9, axis=-1)  # not white
    assert 0.01 < drawn.mean() < 0.5
    # the lower half holds the difference panel: drawn too, and in red where the first differing step is
    lower = pixels[300:, :, :3]
    assert np.any((lower[..., 0] > 0.8) & (lower[..., 1] < 0.3) & (lower[..., 2] < 0.3))


def test_one_run_draws_one_panel(sexpgpu, run_a, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    assert sexpgpu("plot", run_a / "metrics.jsonl", "-o", tmp_path / "one.png")[0] == 0
    pixels = image.imread(tmp_path / "one.png")
    assert pixels.shape[:2] == (600, 900) and np.any(pixels[..., :3] < 0.5)


def test_without_matplotlib_it_says_how_to_install_it(sexpgpu, run_a, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, _, err = sexpgpu("plot", run_a, "-o", tmp_path / "runs.png")
    assert code == 2 and "E-DIFF-003" in err and "pip install 'sexpgpu[plot]'" in err


def test_bad_output_and_runs(sexpgpu, run_a, tmp_path):
    assert "E-DIFF-004" in sexpgpu("plot", run_a, "-o", tmp_path / "runs.svg")[2]
    assert "E-DIFF-001" in sexpgpu("plot", tmp_path / "nowhere", "-o", tmp_path / "runs.png")[2]


def test_an_unwritable_output_is_E_DIFF_004(sexpgpu, run_a, tmp_path):
    pytest.importorskip("matplotlib")
    code, _, err = sexpgpu("plot", run_a, "-o", tmp_path / "no/such/folder/runs.png")
    assert code == 2 and "E-DIFF-004" in err
