"""The CUDA backend on a GPU: every op and gradient against the CPU interpreter, bits that
repeat, the examples, and the CPU/GPU loss envelope. Skipped where no GPU is present.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda -m gpu
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from op_cases import CASES, FORWARD_CASES, GPU_CASES, assert_matches, case_graph, case_id  # noqa: E402
from gpu_driver import ENVELOPE_STEP, ENVELOPE_TAIL, run_on_the_gpu, train  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.errors import SexpgpuError  # noqa: E402
from sexpgpu.backends.cuda.patterns import PATTERN_NAMES  # noqa: E402
from sexpgpu.plan.device import patterns_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(path.name for path in (ROOT / "examples").glob("*.sexp"))
CPU = Interpreter()



@pytest.fixture(scope="module")
def backend():
    from sexpgpu.backends.cuda.backend import CudaBackend

    return CudaBackend()


def _experiment(name: str):
    from sexpgpu.lang.forms import load_experiment

    path = ROOT / "examples" / name if (ROOT / "examples" / name).exists() else ROOT / "bench" / name
    return load_experiment(str(path))


@pytest.mark.parametrize("case", CASES + GPU_CASES, ids=case_id)
def test_op_and_gradient_match_the_interpreter(backend, case):
    graph, values = case_graph(case)
    want = CPU.run(graph, values)
    got = backend.run(graph, values)
    for name in want:
        assert_matches(name, backend.to_host(got[name]), want[name], graph.outputs[name].dtype)


@pytest.mark.parametrize("case", FORWARD_CASES, ids=case_id)
def test_op_without_gradient_matches_the_interpreter(backend, case):
    graph, values = case_graph(case, differentiate=False)
    want = CPU.run(graph, values)
    got = backend.run(graph, values)
    for name in want:
        assert_matches(name, backend.to_host(got[name]), want[name], graph.outputs[name].dtype)


@pytest.mark.parametrize("op", ["gelu", "tanh", "exp", "log", "rsqrt", "sigmoid", "erf", "relu"])
def test_elementwise_ops_give_the_interpreters_bits_on_the_gpu(backend, op):
    kind = "positive" if op in ("log", "rsqrt") else "normal"
    for dtype in ("f32", "bf16"):
        graph, values = case_graph((op, [(dtype, (300, 257), kind)], {}), differentiate=False)
        got = backend.to_host(backend.run(graph, values)["y"])
        assert np.array_equal(got.view(np.uint32), CPU.run(graph, values)["y"].view(np.uint32)), (op, dtype)


def test_a_graph_repeats_its_bits_eager_captured_and_unfused():
    """Call 1 runs eagerly, later calls replay a CUDA graph; SEXPGPU_OPTIMIZE=off runs one
    kernel per node. All three give the same bits."""
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.cuda.fusion import FusionPolicy
    from sexpgpu.run.setup import build_run

    experiment = _experiment("char-lm.sexp")
    built = build_run(experiment, "cpu")
    micro = built.program.training.micro
    state = built.initial_state()
    inputs = {f"param/{path}": value for path, value in state.params.items()}
    inputs.update(built.feeder.train_batch(1, 0))
    inputs = {name: inputs[name] for name in micro.inputs}
    fused = CudaBackend(policy=FusionPolicy("on"))
    runs = [fused.run(micro, inputs) for _ in range(3)]
    unfused = CudaBackend(policy=FusionPolicy("off")).run(micro, inputs)
    for name in runs[0]:
        for other in runs[1:] + [unfused]:
            assert torch.equal(runs[0][name], other[name]), name


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_twice_gives_the_same_bits(name):
    from sexpgpu.backends.cuda.backend import CudaBackend

    experiment = _experiment(name)
    steps = min(experiment.run.steps, 40)
    first = train(experiment, CudaBackend(), steps)
    second = train(experiment, CudaBackend(), steps)
    assert first[0].tobytes() == second[0].tobytes()
    for path in first[1]:
        assert first[1][path].tobytes() == second[1][path].tobytes(), path


@pytest.mark.parametrize("name, steps", [("tiny-adam.sexp", 200), ("char-lm.sexp", 40)])
def test_cpu_and_gpu_loss_curves_stay_in_the_envelope(backend, name, steps):
    experiment = _experiment(name)
    gpu, _ = train(experiment, backend, steps)
    cpu, _ = train(experiment, CPU, steps)
    relative = np.abs(gpu - cpu) / np.abs(cpu)
    assert relative.max() <= ENVELOPE_STEP, relative.max()
    tail = abs(gpu[-10:].mean() - cpu[-10:].mean()) / cpu[-10:].mean()
    assert tail <= ENVELOPE_TAIL
    assert gpu[-10:].mean() < gpu[:5].mean()  # and it learns


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_command_line_runs_each_example_twice_with_the_same_bits(name, tmp_path):
    logs = []
    for attempt in range(2):
        run_dir = run_on_the_gpu(ROOT / "examples" / name, tmp_path / f"run{attempt}")
        logs.append((run_dir / "metrics.jsonl").read_text())
        report = (run_dir / "report.txt").read_text()
        assert "choices" in report and "compute_" in report
    assert logs[0] == logs[1]
    last = json.loads(logs[0].splitlines()[-1])
    assert "step" in last


def test_an_allocation_failure_stops_with_the_memory_line(backend):
    from sexpgpu.graph.core.emit import Emitter

    e = Emitter()
    x, w = e.input("x", "f32", (1, 200_000)), e.input("w", "f32", (200_000, 1))
    huge = e("exp", e("broadcast", x, shape=(200_000, 200_000)))  # 160 GB, written out for the product
    graph = e.graph({"x": x, "w": w}, {"y": e("matmul", huge, w)})
    with pytest.raises(SexpgpuError) as caught:
        backend.run(graph, {"x": np.zeros((1, 200_000), np.float32), "w": np.zeros((200_000, 1), np.float32)})
    assert caught.value.code == "E-MEM-001"
    assert "memory: allocation failed" in caught.value.message


def test_the_facts_name_the_device(backend):
    facts = backend.facts()
    assert facts["determinism"].startswith("1: ")
    assert facts["choices"].startswith("stacking 1, recompute 9.00 flops a byte, 0 convolution engines; on compute_")
    assert "cuBLAS" in facts["choices"] and "Triton" in facts["choices"]
    assert facts["choices"].endswith(f"patterns {patterns_text(backend.policy.patterns, PATTERN_NAMES)}")


def test_fingerprints_on_the_gpu_are_the_cpu_fingerprints(backend):
    """A step's digest is the same on every backend for the same bits."""
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in [(5,), (1000, 513), (24576, 64)]]
    tensors = [torch.from_numpy(array).cuda() for array in arrays]
    tensors.append(torch.from_numpy(arrays[1]).cuda().to(torch.bfloat16))
    expected = CPU.fingerprints(arrays) + CPU.fingerprints([tensors[-1].float().cpu().numpy()])
    assert backend.fingerprints(tensors) == expected
