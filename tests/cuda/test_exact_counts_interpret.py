"""What one exact step makes the host wait for and launch, counted by bench/exact_counts.py under
Triton's interpreter (the exact library on the GPU's paths): a change that brings back a wait
in a sum, or a launch per gradient's digit plane, fails here.

gpt-tiny (bench/gpt-small.sexp cut to 2 layers of width 16, 2 microbatches a step): stacked,
as an exact run is on a GPU, the step waits only for its two reads (the loss and the gradient
norm) and for the generator's ids and labels, checked on the host; no exact sum, product or
rounding waits. (The unstacked step, whose gradients added across calls round in one launch
each, is counted by `bench/exact_counts.py --degree 1`: a second interpreted step here cost a
minute of CI's two cores.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - on a GPU, bench/bench_exact_mode.py --counts counts there
    pytest.skip("a GPU is present: the kernels run compiled there", allow_module_level=True)
pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import exact_counts  # noqa: E402

pytestmark = [pytest.mark.usefixtures("interpreted"), pytest.mark.slow]  # tests/cuda/conftest.py

QUIET = ("microbatch calls: exact-matmul", "microbatch calls: exact-sum", "rounding the gradients",
         "update call: exact-sum")


def test_a_stacked_exact_step_waits_only_for_its_reads_and_the_generators_ids():
    tallies, degree = exact_counts.count_step("gpt-tiny", warmup=0)
    assert degree == 2
    for phase in QUIET:
        assert tallies[phase].sync_count == 0, (phase, tallies[phase].syncs)
    assert tallies["reading back"].sync_count == 2  # the loss vector and the gradient norm
    assert tallies["microbatch calls: check"].sync_count == 4  # ids and labels from the generator, on the device
    assert exact_counts.totals(tallies).sync_count == 6
    assert "forming held sums" not in tallies and "adding the gradients" not in tallies  # one call: no digits
    # each exact product or sum a handful of launches, whatever its data
    for phase in ("microbatch calls: exact-matmul", "microbatch calls: exact-sum"):
        calls = sum(tallies[phase].calls.values())
        assert tallies[phase].launches <= 20 * calls, (phase, tallies[phase].launches, calls)
