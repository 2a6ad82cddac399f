"""cuDNN convolution engines in the CUDA backend without a GPU: backends/cuda/cudnn_engines.py
driven by tests/cuda/fake_frontend.py's stand-in for cuDNN's frontend, and the lowering's
engine steps under Triton's interpreter on the CPU, against the CPU interpreter. What is
offered (deterministic, no TF32, no reduced-precision sums, not compiled at run time,
cuDNN's own engines, built), in the heuristics' order; each role's operands in the node's
order; the workspace in the arena; a convolution the policy does not name runs PyTorch's
convolution; without the frontend nothing is offered and the reason is said."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - tests/cuda/test_conv_engines_gpu.py runs the real frontend
    pytest.skip("a GPU is present: the GPU tests check these there", allow_module_level=True)
pytest.importorskip("triton")

import fake_frontend  # noqa: E402
from fake_frontend import Plan, behavior_note, numerical_note  # noqa: E402
from op_cases import CASES, assert_matches, case_graph, case_id  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda import cudnn_engines  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.fusion import FusionPolicy  # noqa: E402
from sexpgpu.backends.cuda.convolutions import graph_convolutions  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py

CONVOLUTIONS = [case for case in CASES if case.op.startswith("conv2d")]
PLANS = {
    "A": [
        Plan(9, {5: 2}, numerics=(numerical_note.NONDETERMINISTIC,)),  # may sum in another order each call
        Plan(7, {2: 1, 1: 0}, workspace=1000),
        Plan(30, {}, behaviours=(behavior_note.RUNTIME_COMPILATION,)),
        Plan(20_801, {}),  # one of the frontend's own Python engines
        Plan(4, {}, builds=False),
        Plan(12, {14: 2, 5: 3}, numerics=(numerical_note.TENSOR_CORE,)),  # TF32 for float32
        Plan(5, {}, numerics=(numerical_note.WINOGRAD_TILE_4x4,)),  # a transform that rounds otherwise
        Plan(6, {}, numerics=(numerical_note.FFT,)),
    ],
    "FALLBACK": [Plan(7, {2: 1, 1: 0}, workspace=1000), Plan(0, {})],
}


@pytest.fixture(autouse=True)
def frontend(monkeypatch):
    """The fake frontend in the real one's place, on the CPU; each test builds its plans afresh."""
    fake_frontend.installed(monkeypatch, PLANS)
    return fake_frontend


def key_of(case):
    graph, _ = case_graph(case, differentiate=False)
    (key,) = graph_convolutions(graph)
    return key


def test_only_deterministic_float32_built_cudnn_engines_are_offered_in_the_heuristics_order():
    f32 = key_of(CONVOLUTIONS[0])
    assert cudnn_engines.offered(f32, 0) == ("engine 7 knobs 1=0 2=1", "engine 0 knobs")
    bf16 = replace(f32, dtype="bf16")  # tensor cores keep float32 sums for bf16: offered
    assert cudnn_engines.offered(bf16, 0) == ("engine 7 knobs 1=0 2=1", "engine 12 knobs 5=3 14=2", "engine 0 knobs")
    assert cudnn_engines.plans_for(f32, 0).plan_count == 10


def test_a_convolution_cudnn_declines_is_offered_nothing_and_says_why():
    fake_frontend.PLANS.update(A=[], FALLBACK=[])
    key = key_of(CONVOLUTIONS[0])
    assert cudnn_engines.offered(key, 0) == ()
    assert "No valid engine configs" in cudnn_engines.plans_for(key, 0).declined
    with pytest.raises(ValueError, match="cuDNN does not offer 'engine 7 knobs 1=0 2=1' here"):
        cudnn_engines.prepared(key, "engine 7 knobs 1=0 2=1", 0)


def test_without_the_frontend_nothing_is_offered_and_the_reason_is_said(monkeypatch):
    monkeypatch.setattr(cudnn_engines, "_found", {})
    monkeypatch.setitem(__import__("sys").modules, "cudnn", None)  # `import cudnn` raises ImportError
    assert cudnn_engines.frontend() is None
    assert cudnn_engines.unavailable() == ("cuDNN's frontend (nvidia-cudnn-frontend, the extra `cudnn`) is not "
                                           "installed")
    assert cudnn_engines.offered(key_of(CONVOLUTIONS[0]), 0) == ()


@pytest.mark.parametrize("case", CONVOLUTIONS, ids=case_id)
@pytest.mark.parametrize("engine", ["engine 7 knobs 1=0 2=1", "engine 0 knobs"])
def test_each_role_runs_its_engine_with_its_operands_and_matches_the_interpreter(case, engine):
    graph, values = case_graph(case, differentiate=False)
    key = key_of(case)
    backend = CudaBackend(device="cpu", policy=FusionPolicy("on", convolutions={key.key(): engine}))
    (step,) = [step for step in backend.lowered(graph).launches if step.kind == "convolution"]
    assert step.engine == engine
    assert len(step.writes) == (2 if engine.startswith("engine 7 ") else 1)  # the result, and a workspace
    got = backend.to_host(backend.run(graph, values)["y"])
    assert_matches(key.key(), got, Interpreter().run(graph, values)["y"], "f32")
    shapes = cudnn_engines.operand_shapes(key)
    role = {"Forward": "fprop", "Data": "dgrad", "Weight": "wgrad"}[key.role]
    assert fake_frontend.EXECUTED == [(int(engine.split()[1]), role, shapes)]


def test_a_convolution_the_policy_does_not_name_runs_pytorchs():
    case = CONVOLUTIONS[0]
    graph, values = case_graph(case, differentiate=True)
    key = key_of(case)
    backend = CudaBackend(device="cpu", policy=FusionPolicy("on", convolutions={key.key(): "engine 0 knobs"}))
    steps = [step for step in backend.lowered(graph).launches if step.kind == "convolution"]
    assert sorted(map(str, (step.engine for step in steps))) == ["None", "None", "engine 0 knobs"]
    got, want = backend.run(graph, values), Interpreter().run(graph, values)
    for name in want:
        assert_matches(name, backend.to_host(got[name]), want[name], graph.outputs[name].dtype)
    assert [call[1] for call in fake_frontend.EXECUTED] == ["fprop"]


def test_an_input_read_through_a_view_is_made_contiguous_for_the_engine():
    from sexpgpu.graph.core.emit import Emitter

    e = Emitter()
    x = e.input("x", "f32", (2, 5, 7, 2))  # NHWC, transposed to NCHW: a view with other strides
    w = e.input("w", "f32", (3, 2, 2, 3))
    image = e("transpose", x, perm=(0, 3, 1, 2))
    graph = e.graph({"x": x, "w": w}, {"y": e("conv2d", image, w, stride=(1, 2), padding=(0, 1))})
    (key,) = graph_convolutions(graph)
    values = {"x": torch.randn(2, 5, 7, 2).numpy(), "w": torch.randn(3, 2, 2, 3).numpy()}
    backend = CudaBackend(device="cpu", policy=FusionPolicy("on", convolutions={key.key(): "engine 0 knobs"}))
    got = backend.to_host(backend.run(graph, values)["y"])
    assert_matches("y", got, Interpreter().run(graph, values)["y"], "f32")


def test_a_policy_naming_an_engine_not_offered_stops_the_lowering():
    case = CONVOLUTIONS[0]
    graph, _ = case_graph(case, differentiate=False)
    backend = CudaBackend(device="cpu", policy=FusionPolicy("on", convolutions={key_of(case).key(): "engine 9 knobs 5=2"}))
    with pytest.raises(ValueError, match="cuDNN does not offer 'engine 9 knobs 5=2' here"):
        backend.lowered(graph)


def test_each_convolutions_plans_are_built_once_a_process():
    key = key_of(CONVOLUTIONS[0])
    assert cudnn_engines.plans_for(key, 0) is cudnn_engines.plans_for(key, 0)
    assert len(fake_frontend.HANDLES) >= 1
    assert cudnn_engines.prepared(key, "engine 7 knobs 1=0 2=1", 0).workspace_bytes == 1000
