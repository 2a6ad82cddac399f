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

import numpy as np  # noqa: E402

from random_graphs import OP_NAMES, graph_from_seed, run_seeds, summary  # noqa: E402

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
    assert frozenset().union(*(outcome.ops for outcome in outcomes)) >= frozenset(OP_NAMES), line


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


class _Planted:
    """A backend giving the reference's results, but for one output whose largest element is
    off by 1e-3 relative: a wrong value, far beyond any rounding."""

    def __init__(self, backend, name: str):
        self.backend, self.name = backend, name

    def run(self, graph, values):
        results = dict(self.backend.run(graph, values))
        value = np.array(self.backend.to_host(results[self.name]))
        flat = value.reshape(-1)
        flat[int(np.argmax(np.abs(flat)))] *= 1 + 1e-3
        results[self.name] = value
        return results

    def to_host(self, value):
        return self.backend.to_host(value)


def test_the_comparison_reports_a_wrong_attention_element():
    from random_graphs import compare
    from sexpgpu.backends.cpu import Interpreter

    sample = graph_from_seed(OP_NAMES.index("attention_core"), "tiny")
    assert "y0" in sample.attended and sample.graph.outputs["y0"].op == "attention_core"
    reference = Interpreter()
    assert compare(reference, reference, sample).failures == ()
    planted = compare(_Planted(reference, "y0"), reference, sample)
    assert len(planted.failures) == 1 and planted.failures[0].startswith("y0: ")


def test_attention_outputs_are_refereed_by_the_attention_envelope():
    """An error spread over a whole attention output, twice the interpreter's largest, where
    the interpreter is exact elsewhere (as 3xTF32 and the backward's D spread it): within the
    attention's norm-wise envelope, though not within the element-wise referee, which an
    output that reads no attention keeps. One element off by 1e-3 relative passes neither."""
    from random_graphs import _as_close_to_float64

    sample = graph_from_seed(OP_NAMES.index("attention_core"), "tiny")
    exact = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    interpreted = exact.copy()
    interpreted[0, 0] += 1e-6
    spread = exact + 2e-6 * np.where(np.arange(12).reshape(3, 4) % 2, 1.0, -1.0)
    planted = exact.copy()
    planted[2, 3] *= 1 + 1e-3
    float64 = {"y0": exact}
    f32 = lambda value: value.astype(np.float32)
    assert _as_close_to_float64("y0", f32(spread), f32(interpreted), sample, float64)
    assert not _as_close_to_float64("y0", f32(spread), f32(interpreted), sample._replace(attended=frozenset()), float64)
    assert not _as_close_to_float64("y0", f32(planted), f32(interpreted), sample, float64)


def test_only_outputs_computed_from_attention_are_attended():
    sample = graph_from_seed(994, "gpu")
    assert sample.attended == {"y0", "y1", "y4", "loss"} | {f"grad/x{index}" for index in (0, 1, 2, 6, 7, 8, 11)}
    assert graph_from_seed(OP_NAMES.index("softmax"), "tiny").attended == frozenset()
