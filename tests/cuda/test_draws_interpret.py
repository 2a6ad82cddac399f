"""Draws in the CUDA backend, under Triton's interpreter: keys folded on the device, the
interpreter's bits and numerics' own, for every draw op, salt kind, shape and stacking.
tests/cuda/test_draws_gpu.py checks the same on a GPU, and that the graph is captured."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs tests/cuda/test_draws_gpu.py instead
    pytest.skip("a GPU is present: the GPU tests check these draws there", allow_module_level=True)
pytest.importorskip("triton")

from draw_cases import cases, draw_graph, draw_inputs, expected, same_bits  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.fusion import FusionPolicy  # noqa: E402
from sexpgpu.backends.cuda.runtime import host_split  # noqa: E402
from sexpgpu.graph.passes.exact_region import exact_graph  # noqa: E402

pytestmark = [pytest.mark.usefixtures("interpreted"),  # tests/cuda/conftest.py
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # the interpreter's uint32 wraps

CASES = cases(shapes=[(3, 5), (), (1031,)], row_shapes=[(2, 7)], stacked_shapes=[(2, (6, 3))])


@pytest.fixture(scope="module")
def graph():
    return draw_graph(CASES)


@pytest.mark.slow
def test_every_draw_gives_the_interpreters_bits_and_numerics(graph):
    """Each draw is the interpreter's bits, and the draw numerics makes from the documented
    salting (fold_in of each salt in order, a key per record, a stacked block repeated)."""
    backend, inputs = CudaBackend(device="cpu"), draw_inputs(3)
    got, want = backend.run(graph, inputs), Interpreter().run(graph, inputs)
    wrong = [case.name for case in CASES if not same_bits(want[case.name], expected(case, inputs))
             or not same_bits(backend.to_host(got[case.name]), want[case.name])]
    assert not wrong


def test_a_graph_with_draws_is_capturable_draws_each_calls_salts_and_unfused_the_same_bits():
    """Nothing in a draw's step stops capture (no host value, no read back), under either
    arithmetic; a second call draws for its own salts; one kernel per node changes no bit."""
    draws = cases(shapes=[(2, 3)], row_shapes=[(3,)], stacked_shapes=[(2, (4,))], ops=("uniform", "bernoulli"))
    graph = draw_graph(draws)
    fused, unfused = CudaBackend(device="cpu"), CudaBackend(device="cpu", policy=FusionPolicy("off"))
    assert host_split(fused.lowered(graph)) is not None
    assert host_split(CudaBackend(device="cpu").lowered(exact_graph(graph))) is not None
    for step in (5, 6):
        inputs = draw_inputs(step, microbatch=step % 2, trip=step)
        first, second = fused.run(graph, inputs), unfused.run(graph, inputs)
        for case in draws:
            assert same_bits(fused.to_host(first[case.name]), expected(case, inputs)), (step, case.name)
            assert torch.equal(first[case.name], second[case.name]), (step, case.name)


@pytest.mark.parametrize("degree", [1, 2])
def test_the_cnn_examples_generator_gives_the_interpreters_bits(degree):
    """examples/cnn.sexp's generator (uniforms, a bernoulli and a normal salted by :step
    :trip; a max, exponentials): every field the interpreter's bits, stacked too."""
    from pathlib import Path

    from sexpgpu.graph.training.stacking import stack_generator
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    example = Path(__file__).resolve().parents[2] / "examples" / "cnn.sexp"
    generator = stack_generator(build_run(load_experiment(str(example)), "cpu").program, degree)
    backend = CudaBackend(device="cpu")
    for step in (1, 2):
        inputs = {name: np.int32(value) for name, value in (("step", step), ("trip", 0), ("microbatch", 0))
                  if name in generator.inputs}
        got, want = backend.run(generator, inputs), Interpreter().run(generator, inputs)
        for name in want:
            assert same_bits(backend.to_host(got[name]), want[name]), (step, name)
