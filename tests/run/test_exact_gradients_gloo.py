"""Exact sums compose across processes: each rank's step gradients, kept as accumulators
over its microbatches and summed over gloo with det_all_reduce, round to the one-process
gradients bit for bit at 1, 2 and 4 processes, whichever microbatches each rank takes (here
every W-th; a run on several processes gives each a contiguous share, tests/run/test_distributed.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exact"))
from test_exact_distributed import run_world  # noqa: E402

import exact_gradients_worker as worker  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_per_rank_gradient_accumulators_reduced_over_gloo_equal_one_process(world, tmp_path):
    wanted = worker.one_process()
    for result in run_world(world, tmp_path, job=worker.run):
        assert list(result) == list(wanted)
        for name, value in wanted.items():
            assert torch.equal(result[name].view(torch.int32), value.view(torch.int32)), name
