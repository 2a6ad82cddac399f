"""bench_choices' account of where stacking's gain lies, from two profiles by kind of launch
(on a GPU; the smoke run on the CPU has none)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_choices  # noqa: E402


def test_stacking_by_kind_lists_each_kind_the_unstacked_calls_spend_more_on_first():
    unstacked = {"matmul": 0.080, "elementwise": 0.010, "copy": 0.001}
    stacked = {"matmul": 0.070, "elementwise": 0.009, "rows": 0.002}
    line, = bench_choices.stacking_by_kind(unstacked, stacked, 4)
    assert "unstacked against stacking 4: 91.00 against 81.00 ms" in line
    assert line.endswith("matmul 80.00 against 70.00, elementwise 10.00 against 9.00, "
                         "copy 1.00 against 0.00, rows 0.00 against 2.00")


def test_nothing_is_said_without_both_profiles_or_without_stacking():
    assert bench_choices.stacking_by_kind({}, {"matmul": 1.0}, 4) == []
    assert bench_choices.stacking_by_kind({"matmul": 1.0}, {"matmul": 1.0}, 1) == []
