"""Draws on a GPU: keys folded on the device, in a captured graph. Every draw op under every
kind of salt, odd and large shapes, per-record salts and stacked draws give the interpreter's
bits and numerics' own, eagerly (the first call), captured (the second) and replayed with
other steps (the salts reach the keys through the captured graph's static buffers); a draw
waits for nothing and reads nothing back; the CNN example's generator is captured and gives
the interpreter's bits at every step, stacked too.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_draws_gpu.py -m gpu
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from draw_cases import cases, draw_graph, draw_inputs, expected, same_bits  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CASES = cases(shapes=[(3, 5), (), (1,), (1031,), (3, 333337)], row_shapes=[(2, 7), (), (4099,)],
              stacked_shapes=[(2, (6, 3)), (3, (21,)), (4, (4 * 65537,)), (8, (8 * 3, 1000))])
CPU = Interpreter()


@pytest.fixture(scope="module")
def graph():
    return draw_graph(CASES)


def _wrong(backend, graph, inputs, draws) -> list:
    got, want = backend.run(graph, inputs), CPU.run(graph, inputs)
    return [case.name for case in draws if not same_bits(want[case.name], expected(case, inputs))
            or not same_bits(backend.to_host(got[case.name]), want[case.name])]


def _captured(backend, graph) -> bool:
    from sexpgpu.backends.cuda.runtime import Captured

    runner = backend._entry(graph)[2]
    return isinstance(runner, Captured) and runner.graph is not None


def test_draws_eager_captured_and_replayed_give_the_interpreters_bits(graph):
    """Call 1 runs eagerly, call 2 captures and replays, calls 3 and 4 replay at other
    steps, microbatches and trips (and step 3 again): the bits of each call's own salts."""
    from sexpgpu.backends.cuda.backend import CudaBackend

    backend = CudaBackend()
    for call, step in enumerate((3, 4, 7, 3)):
        inputs = draw_inputs(step, microbatch=call, trip=step + 1)
        wrong = _wrong(backend, graph, inputs, CASES)
        assert not wrong, (call, step, wrong)
        assert _captured(backend, graph) == (call >= 1), call


def test_a_draw_waits_for_nothing_and_reads_nothing_back(graph):
    """With inputs already on the device, an eager call (one kernel per node, never captured)
    makes no synchronising call: no salt is read on the host, no draw copied from it."""
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.cuda.fusion import FusionPolicy

    backend = CudaBackend(policy=FusionPolicy("off"))
    on_device = {name: torch.as_tensor(np.asarray(value)).cuda() for name, value in draw_inputs(2).items()}
    backend.run(graph, on_device)  # compiles the kernels and puts the constants on the device
    on_device.update(step=torch.tensor(9, dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = backend.run(graph, on_device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    inputs = dict(draw_inputs(2), step=9)
    assert all(same_bits(backend.to_host(got[case.name]), expected(case, inputs)) for case in CASES)


@pytest.mark.parametrize("degree", [1, 2])
def test_the_cnn_examples_generator_is_captured_with_the_interpreters_bits(degree):
    """examples/cnn.sexp draws every microbatch (two uniforms, a bernoulli and a normal salted
    by :step :trip): captured from its second call, its fields are the interpreter's bits at
    every step, unstacked and stacked (each draw's block repeated)."""
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.graph.training.stacking import stack_generator
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    program = build_run(load_experiment(str(ROOT / "examples" / "cnn.sexp")), "cpu").program
    generator = stack_generator(program, degree)
    backend = CudaBackend()
    for step in (1, 2, 3, 1):
        inputs = {"step": np.int32(step), "trip": np.int32(0), "microbatch": np.int32(0)}
        inputs = {name: inputs[name] for name in generator.inputs}
        got, want = backend.run(generator, inputs), CPU.run(generator, inputs)
        for name in want:
            assert same_bits(backend.to_host(got[name]), want[name]), (step, name)
    assert _captured(backend, generator)
