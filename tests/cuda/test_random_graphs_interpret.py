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

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py

# SEXPGPU_DIFF_GRAPHS_INTERPRET raises the count for a longer local run.
COUNT = int(os.environ.get("SEXPGPU_DIFF_GRAPHS_INTERPRET", len(OP_NAMES)))




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


class _Drifting:
    """A backend whose float results are off by 1e-4 relative: five times the float32
    tolerance, so the comparison must report every graph with a float output."""

    def __init__(self, backend):
        self.backend = backend

    def run(self, graph, values):
        return self.backend.run(graph, values)

    def to_host(self, value):
        array = self.backend.to_host(value)
        return array * (1 + 1e-4) + 1e-4 if array.dtype.kind == "f" else array


def test_the_comparison_reports_a_drift_and_an_error():
    from random_graphs import compare
    from sexpgpu.backends.cpu import Interpreter

    sample = graph_from_seed(OP_NAMES.index("softmax"), "tiny")
    reference = Interpreter()
    drifted = compare(_Drifting(reference), reference, sample)
    assert drifted.failures and all("Not equal to tolerance" in failure for failure in drifted.failures)
    assert compare(reference, reference, sample).failures == ()
    broken = compare(reference, reference, sample._replace(values={}))
    assert len(broken.failures) == 1 and broken.failures[0].startswith("error: ")
