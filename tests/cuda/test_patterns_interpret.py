"""cuDNN's native pattern graphs in the CUDA backend without a GPU: backends/cuda/cudnn_patterns.py
and pattern_launches.py driven by tests/cuda/fake_frontend.py's stand-in for cuDNN's frontend,
the rest of the lowering under Triton's interpreter on the CPU, against the CPU interpreter.

What is checked: each pattern's group becomes one step running the graph its builder makes
(sdpa, sdpa_backward asked for the deterministic algorithm, matmul or conv_fprop + add +
activation), with the operands' layouts as the lowering holds them (attention's heads read
in place through a transposed view; dK and dV written side by side into one buffer), the
backward reading the forward's statistics; a group cuDNN declines is lowered as without
patterns, and says why; what the probe answers the plan (the uses, the convolutions left
to engines); and which patterns a backend puts on (SEXPGPU_PATTERNS, the device)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - tests/cuda/test_patterns_gpu.py runs the real frontend
    pytest.skip("a GPU is present: the GPU tests check these there", allow_module_level=True)
pytest.importorskip("triton")

import fake_frontend  # noqa: E402
from attention_checks import ENVELOPE, attention_case  # noqa: E402
from fake_frontend import Plan  # noqa: E402
from op_cases import case_graph, random_array  # noqa: E402
from pattern_cases import epilogue_graph, strided_attention_graph  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda import backend as backend_module, cudnn_engines, cudnn_patterns  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.fusion import FusionPolicy  # noqa: E402
from sexpgpu.backends.cuda.probe import CudaProbe  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402
from sexpgpu.backends.cuda.convolutions import graph_convolutions  # noqa: E402
from sexpgpu.backends.cuda.patterns import PATTERN_NAMES, patterns_line  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py

CPU = Interpreter()
PATTERNS_ON = FusionPolicy(patterns=PATTERN_NAMES)
PLANS = {"A": [Plan(9, {}, numerics=(fake_frontend.numerical_note.NONDETERMINISTIC,)), Plan(3, {2: 1}, workspace=96)],
         "FALLBACK": [Plan(0, {})]}
# a pattern sums and rounds inside cuDNN's graph where the interpreter rounds between nodes:
# within bf16's envelope of the interpreter (docs/cuda.md, "cuDNN's pattern graphs")
WITHIN = {"bf16": ENVELOPE["bf16"], "f32": (2e-5, 2e-6)}


@pytest.fixture(autouse=True)
def frontend(monkeypatch):
    """The fake frontend in the real one's place, on the CPU; each test builds its plans afresh."""
    fake_frontend.installed(monkeypatch, PLANS)
    return fake_frontend


def assert_within(graph, got: dict, want: dict, backend) -> None:
    rtol, atol = WITHIN["bf16" if any(node.dtype == "bf16" for node in graph.nodes) else "f32"]
    for name, expected in want.items():
        scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
        np.testing.assert_allclose(backend.to_host(got[name]), expected, rtol=rtol, atol=atol * scale, err_msg=name)


def run_both(graph, values, policy=PATTERNS_ON):
    backend = CudaBackend(device="cpu", policy=policy)
    got = backend.run(graph, values)
    assert_within(graph, got, CPU.run(graph, values), backend)
    return backend, backend.lowered(graph)


def pattern_launches(lowered) -> list:
    return [step for step in lowered.launches if step.kind == "pattern"]


# --- attention ----------------------------------------------------------------------------------

def test_bf16_attention_runs_cudnns_forward_and_deterministic_backward_within_the_envelope():
    graph, values = case_graph(attention_case([(1, 2, 8, 16)] * 3, "bf16", True), seed=1)
    backend, lowered = run_both(graph, values)
    assert [step.pattern.split(" {")[0] for step in pattern_launches(lowered)] == ["Forward Attention", "Backward Attention"]
    assert not [step for step in lowered.launches if step.kind == "attention"]  # none of the backend's own kernels
    assert [kinds for _, kinds, _ in fake_frontend.EXECUTED] == ["sdpa", "sdpa_backward"]
    forward, backward = fake_frontend.ATTENTION_CALLS
    assert forward["generate_stats"] is True and backward["use_deterministic_algorithm"] is True
    assert forward["attn_scale"] == backward["attn_scale"] == 0.25
    assert forward["diagonal_band_right_bound"] == 0 == backward["diagonal_band_right_bound"]
    assert all(use.taken for use in lowered.patterns) and len(lowered.patterns) == 2
    # the first plan offered: engine 9 is nondeterministic, so engine 3, with its workspace in the arena
    assert {step.engine for step in pattern_launches(lowered)} == {"engine 3 knobs 2=1"}
    assert all(len(step.writes) >= 2 for step in pattern_launches(lowered))


def test_heads_are_read_in_place_and_dk_dv_written_side_by_side():
    """q, k, v as (batch, heads, tokens, width) transposed views of (batch, tokens, heads,
    width) buffers, no causal mask, unequal lengths: cuDNN is given the views' strides."""
    graph, values = strided_attention_graph({"q": (2, 5, 2, 8), "k": (2, 7, 2, 8), "v": (2, 7, 2, 8)}, causal=False)
    run_both(graph, values)
    forward, backward = fake_frontend.GRAPHS[0], fake_frontend.GRAPHS[1]
    assert forward.tensors[0].dim == [2, 2, 5, 8] and forward.tensors[0].stride == [80, 8, 16, 1]
    assert "diagonal_band_right_bound" not in fake_frontend.ATTENTION_CALLS[0]
    dk, dv = [tensor for tensor in backward.tensors if tensor.output][1:]
    assert dk.stride == dv.stride == [2 * 7 * 16, 7 * 16, 16, 1]  # one (batch, heads, 7, 8 + 8) buffer


def test_a_backward_without_its_forward_computes_the_statistics_first():
    graph, values = case_graph(attention_case([(1, 2, 8, 16)] * 3, "bf16", True), seed=2, differentiate=False)
    e = Emitter()
    q, k, v, o, g = (e.input(f"x{index}", "bf16", (1, 2, 8, 16)) for index in range(5))
    dq = e("attention_grad_q", q, k, v, o, g, scale=0.25, causal=True)
    graph = e.graph({f"x{index}": node for index, node in enumerate((q, k, v, o, g))}, {"dq": dq})
    rng = np.random.default_rng(4)
    values = {f"x{index}": random_array(rng, "bf16", (1, 2, 8, 16), "normal") for index in range(5)}
    run_both(graph, values)
    assert [kinds for _, kinds, _ in fake_frontend.EXECUTED] == ["sdpa", "sdpa_backward"]


def test_a_backward_cudnn_declines_runs_the_backends_kernels_and_says_why():
    fake_frontend.DECLINED.add("sdpa_backward")
    graph, values = case_graph(attention_case([(1, 1, 8, 16)] * 3, "bf16", True), seed=1)
    backend, lowered = run_both(graph, values)
    assert [step.kind for step in lowered.launches].count("pattern") == 1
    assert [step.kind for step in lowered.launches].count("attention") >= 2  # its own log-sum-exp, row deltas, dq, dkv
    taken, declined = lowered.patterns
    assert taken.taken and not declined.taken and "No valid engine configs for sdpa_backward" in declined.why
    line = patterns_line(backend.patterns, lowered.patterns)
    assert "fused attention on: 1 of 2 by cuDNN, the rest lowered as without patterns (cuDNN declines Backward" in line


def test_float32_attention_and_a_policy_without_patterns_lower_as_before():
    for dtype, policy in (("f32", PATTERNS_ON), ("bf16", FusionPolicy())):
        graph, _ = case_graph(attention_case([(1, 1, 8, 16)] * 3, dtype, False), seed=5)
        lowered = CudaBackend(device="cpu", policy=policy).lowered(graph)
        assert not pattern_launches(lowered) and not lowered.patterns
    assert fake_frontend.EXECUTED == []


# --- products and convolutions with their epilogues ----------------------------------------------

@pytest.mark.parametrize("product, dtype, activation", [
    ("matmul", "bf16", "relu"), ("matmul", "bf16", "gelu"), ("matmul", "bf16", None),
    ("conv2d", "f32", "relu"), ("conv2d", "bf16", "relu"),
])
def test_a_product_with_its_bias_and_activation_is_one_cudnn_graph(product, dtype, activation):
    graph, values = epilogue_graph(product, dtype, activation)
    _, lowered = run_both(graph, values)
    (step,) = pattern_launches(lowered)
    kinds = ["fprop" if product == "conv2d" else "matmul", "add"] + ([activation] if activation else [])
    ((_, ran, shapes),) = fake_frontend.EXECUTED
    assert ran == "+".join(kinds)
    kept = activation is not None  # the activation's gradient reads the biased sum: written too
    assert len(shapes) == 3 + 1 + kept
    if product == "conv2d":
        assert shapes[2] == (1, 4, 1, 1)  # the bias, as cuDNN broadcasts it
        assert [s.kind for s in lowered.launches].count("convolution") == 2  # the two cotangents


def test_an_eval_graph_keeps_only_the_activation():
    graph, values = epilogue_graph("matmul", "bf16", "relu", differentiate=False)
    run_both(graph, values)
    ((_, _, shapes),) = fake_frontend.EXECUTED
    assert len(shapes) == 4  # a, b, bias and the activation: the biased sum stays inside cuDNN's graph


def test_a_declined_product_lowers_as_without_patterns():
    fake_frontend.DECLINED.add("matmul")
    graph, values = epilogue_graph("matmul", "bf16", "gelu")
    _, lowered = run_both(graph, values)
    assert not pattern_launches(lowered) and [use.taken for use in lowered.patterns] == [False]
    assert [step.kind for step in lowered.launches].count("matmul") == 3  # the forward and the two cotangents


def test_the_probe_leaves_to_engines_only_the_convolutions_no_pattern_computes():
    graph, _ = epilogue_graph("conv2d", "f32", "relu")
    every = graph_convolutions(graph)
    probe = CudaProbe(CudaBackend(device="cpu", policy=PATTERNS_ON))
    assert [key.role for key in every] == ["Forward", "Data", "Weight"]
    assert [key.role for key in probe.convolution_keys(graph)] == ["Data", "Weight"]
    assert CudaProbe(CudaBackend(device="cpu", policy=FusionPolicy())).convolution_keys(graph) == every
    (use,) = probe.pattern_uses(graph)
    assert use.pattern == "convolutions" and use.taken and use.key.endswith("f32 + bias + relu, keeping the sum")


def test_the_device_facts_and_the_facts_line_name_the_patterns_on(monkeypatch):
    backend = CudaBackend(device="cpu", policy=FusionPolicy(patterns=("attention",)))
    assert backend.facts()["choices"].endswith("patterns attention")
    assert CudaBackend(device="cpu", policy=PATTERNS_ON).facts()["choices"].endswith("patterns on")


# --- which patterns a backend puts on --------------------------------------------------------------

def test_a_backend_on_triton_s_interpreter_has_every_pattern_off_and_says_why(monkeypatch):
    monkeypatch.delenv("SEXPGPU_PATTERNS", raising=False)
    backend = CudaBackend(device="cpu")
    assert backend.policy.patterns == () and backend.patterns.on == ()
    assert patterns_line(backend.patterns, ()) == f"off: {cudnn_patterns.INTERPRETED}"


HELD = ("products with their epilogues off: held off: a product + bias + relu graph gave wrong values on the H200 "
        "with cuDNN 9.19; convolutions with their epilogues off: held off: cuDNN 9.19's fused convolution plans "
        "failed at execution on the H200")


@pytest.mark.parametrize("setting, version, found, expected", [
    (None, 91900, True, "fused attention on: none in these graphs; " + HELD),
    ("on", 91900, True, "fused attention on: none in these graphs; " + HELD),
    ("off", 91900, True, "off: SEXPGPU_PATTERNS=off"),
    (None, 90000, True, "fused attention off: cuDNN 90000 is older than 91300, the first with its graph; " + HELD),
    (None, 8907, True, "fused attention off: cuDNN 8907 is older than 91300, the first with its graph; products with "
                       "their epilogues off: cuDNN 8907 is older than 90000, the first with its graph; convolutions "
                       "with their epilogues off: cuDNN 8907 is older than 90000, the first with its graph"),
    (None, 91900, False, "off: cuDNN's frontend (nvidia-cudnn-frontend, the extra `cudnn`) is not installed"),
])
def test_the_patterns_on_follow_the_setting_and_what_cudnn_supports(monkeypatch, setting, version, found, expected):
    """The device is a GPU here (the support check is asked of a cuda device); the frontend
    is the fake one, of the cuDNN version given, or none."""
    if setting is None:
        monkeypatch.delenv("SEXPGPU_PATTERNS", raising=False)
    else:
        monkeypatch.setenv("SEXPGPU_PATTERNS", setting)
    monkeypatch.setattr(fake_frontend, "VERSION", version)
    if not found:
        monkeypatch.setattr(cudnn_engines, "_found", {"module": None, "why": expected[len("off: "):]})
    decided = backend_module.patterns_here(torch.device("cuda"))
    line = patterns_line(decided, ())
    assert line == expected


def test_a_bad_setting_is_a_coded_error(monkeypatch):
    from sexpgpu.errors import SexpgpuError

    monkeypatch.setenv("SEXPGPU_PATTERNS", "maybe")
    with pytest.raises(SexpgpuError) as raised:
        CudaBackend(device="cpu")
    assert raised.value.code == "E-CONFIG-001" and "SEXPGPU_PATTERNS is 'maybe': expected on, off" in raised.value.message
