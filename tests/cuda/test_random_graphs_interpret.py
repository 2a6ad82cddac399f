"""The differential test's CI sample: random graphs over every op (tests/cuda/random_graphs.py),
run by the CUDA backend under Triton's interpreter on the CPU, against the CPU interpreter.
One graph per op of the table, each starting with that op, on tiny shapes with axes of size
1, 0-d values and broadcasting. tests/cuda/test_random_graphs_gpu.py runs thousands on a GPU."""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs tests/cuda/test_random_graphs_gpu.py instead
    pytest.skip("a GPU is present: the GPU test runs these graphs there", allow_module_level=True)
pytest.importorskip("triton")

from random_graphs import OP_NAMES, graph_from_seed, run_seeds, summary  # noqa: E402
from sexpgpu.graph.ops import OPS  # noqa: E402

# SEXPGPU_DIFF_GRAPHS_INTERPRET raises the count for a longer local run.
COUNT = int(os.environ.get("SEXPGPU_DIFF_GRAPHS_INTERPRET", len(OP_NAMES)))


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    """Triton's interpreter for these tests only (Triton reads the variable at each launch)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_random_graphs_match_the_interpreter(capsys):
    start = time.perf_counter()
    outcomes = run_seeds(range(COUNT), "tiny", device="cpu")
    line = summary(outcomes, "tiny, Triton interpreter", time.perf_counter() - start)
    with capsys.disabled():
        print("\n" + line)
    assert not [outcome for outcome in outcomes if outcome.failures], line
    assert frozenset().union(*(outcome.ops for outcome in outcomes)) >= frozenset(OPS), line


def test_a_seed_gives_the_same_graph_and_values():
    first, again = graph_from_seed(17, "gpu"), graph_from_seed(17, "gpu")
    assert first.graph.dump() == again.graph.dump()
    assert all((first.values[name] == again.values[name]).all() for name in first.values)
    assert graph_from_seed(18, "gpu").graph.dump() != first.graph.dump()
