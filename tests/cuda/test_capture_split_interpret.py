"""Capturing an exact graph (runtime.py's host_split and Captured), run on the CPU by Triton's
interpreter: the id checks run on the host before each replay, the gradient region's pending
sums are made after it, and replaying the device steps alone gives every output the eager
executable gives, call after call, with the interpreter's bits. tests/cuda/test_exact_mode_gpu.py
runs the same graphs captured on the device.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - the GPU tests capture for real
    pytest.skip("a GPU is present: exact graphs are captured there", allow_module_level=True)
pytest.importorskip("triton")

from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.runtime import AFTER_REPLAY, BEFORE_REPLAY, Captured, host_split  # noqa: E402
from sexpgpu.backends.exact_sums import PendingSum, accumulated, rounded_once  # noqa: E402
from sexpgpu.errors import SexpgpuError  # noqa: E402
from sexpgpu.exact import Accumulator, det_finalize  # noqa: E402
from test_exact_mode_interpret import exact_case, region_graph  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")
CPU = Interpreter()


class Replayed(Captured):
    """Captured with the device steps run again in place of a CUDA graph's replay."""

    def _recorded(self, env):
        return "the device steps"

    def replay(self) -> None:
        for step in self.split.device:
            step(self.env)


def runner(graph):
    backend = CudaBackend(device="cpu")
    return backend, Replayed(backend._entry(graph)[1])


def accepted(backend, graph, values: dict) -> dict:
    return {name: backend._accept(name, graph.inputs[name], value) for name, value in values.items()}


def same_value(found, want) -> bool:
    if isinstance(want, Accumulator):
        return torch.equal(accumulated(found).digits, want.digits) and \
            torch.equal(rounded_once(found), det_finalize(want))
    return np.asarray(found).tobytes() == np.asarray(want).tobytes()


def test_checks_run_before_the_replay_and_the_region_after_it():
    graph, _ = region_graph()
    backend, _ = runner(graph)
    lowered = backend.lowered(graph)
    split = host_split(lowered)
    assert split is not None and {step.kind for step in split.after} == {"exact-region", "hold"}
    assert not {step.kind for step in split.device} & (BEFORE_REPLAY | AFTER_REPLAY)
    written = {key for step in split.after for key in step.writes}
    assert written and not any(key in written for step in split.device for key in step.reads)


def test_replays_give_the_eager_outputs_and_fresh_pending_sums_each_call():
    graph, values = region_graph()
    backend, replayed = runner(graph)
    rng = np.random.default_rng(5)
    for call in range(4):  # the first eager, the second captures, then replays
        these = {name: (value * np.float32(rng.standard_normal())).astype(np.float32) for name, value in values.items()}
        got = replayed(accepted(backend, graph, these))
        want = CPU.run(graph, these)
        assert isinstance(got["grad/b"], PendingSum)
        assert all(same_value(backend.to_host(got[name]) if not isinstance(want[name], Accumulator) else got[name],
                              want[name]) for name in want), call
        if call:
            assert replayed.graph is not None and not replayed.eager
            # the pending sums are the caller's alone: the static environment keeps none alive
            assert not any(isinstance(value, (PendingSum, Accumulator)) for value in replayed.env.values())


def test_an_id_out_of_range_stops_a_replayed_call_before_the_replay():
    graph, values = exact_case(("scatter_add", [("i32", (6,), "labels:4"), ("f32", (6, 3), "normal")], {"rows": 4}))
    backend, replayed = runner(graph)
    assert {step.kind for step in host_split(backend.lowered(graph)).before} == {"check"}
    for _ in range(2):
        replayed(accepted(backend, graph, values))
    bad = {**values, "x0": np.array([0, 1, 2, 3, 4, 0], np.int32)}
    replays = []
    replayed.replay = lambda: replays.append(1)
    with pytest.raises(SexpgpuError) as refused:
        replayed(accepted(backend, graph, bad))
    assert refused.value.code == "E-INDEX-001" and not replays


def test_a_check_of_a_computed_id_is_not_split():
    graph, _ = region_graph()
    lowered = CudaBackend(device="cpu").lowered(graph)
    check = next(step for step in lowered.launches if step.kind == "hold")
    computed = type(check)(check.run, (lowered.launches[0].writes[0],), (), "check")
    assert host_split(dataclasses.replace(lowered, launches=[computed, *lowered.launches])) is None
