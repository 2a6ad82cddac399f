"""The mechanisms of the machine's choices on a GPU: the probe, each float32 product
implementation, stacked steps, and an allocation failure the backend survives.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_mechanisms_gpu.py -m gpu -s
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.fusion import FusionPolicy  # noqa: E402
from sexpgpu.backends.cuda.probe import CudaProbe, product_graph  # noqa: E402
from sexpgpu.errors import SexpgpuError  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402
from sexpgpu.plan.device import DeviceFacts, ProductShape  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [ProductShape(4096, 512, 2048), ProductShape(1024, 1024, 1024, batch=4, b_transposed=True),
          ProductShape(2048, 768, 3072, a_transposed=True)]


@pytest.fixture(scope="module")
def probe():
    return CudaProbe(CudaBackend())


def test_the_probe_reports_the_devices_facts_and_free_memory(probe):
    facts = probe.device_facts()
    assert isinstance(facts, DeviceFacts) and facts.gpu == torch.cuda.get_device_name()
    assert facts.compute.startswith("compute_") and facts.multiprocessors > 0 and facts.driver.isdigit()
    assert list(facts.libraries) == ["cuBLAS", "cuDNN", "Triton"]
    free, total = torch.cuda.mem_get_info()
    assert 0 < probe.free_memory_bytes() <= total
    print("\n", facts.gpu, facts.line(), "driver", facts.driver)


def test_the_measured_recompute_budget_is_plausible(probe):
    import time

    probe.measure_throughput()  # compiles the kernel
    start = time.perf_counter()
    rates = probe.measure_throughput()
    spent = time.perf_counter() - start
    print(f"\nf32 {rates.flops_per_second / 1e12:.1f} Tflop/s, copy {rates.bytes_per_second / 1e12:.2f} TB/s, "
          f"{rates.flops_per_byte:.2f} flops a byte, measured in {spent:.3f} s")
    assert spent < 0.5
    assert 1.0 < rates.flops_per_byte < 100.0


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.key())
def test_each_product_implementation_is_close_to_float64_and_repeats_its_bits(probe, shape):
    graph = product_graph(shape)
    rng = np.random.default_rng(0)
    values = {name: rng.standard_normal(node.shape).astype(np.float32) for name, node in graph.inputs.items()}
    a = values["a"].astype(np.float64)
    b = values["b"].astype(np.float64)
    a = np.swapaxes(a, -1, -2) if shape.a_transposed else a
    b = np.swapaxes(b, -1, -2) if shape.b_transposed else b
    want = a @ b
    timings = {}
    for implementation in probe.product_implementations(shape):
        backend = CudaBackend(policy=FusionPolicy(products={shape.key(): implementation}))
        first = backend.to_host(backend.run(graph, values)["c"])
        again = backend.to_host(backend.run(graph, values)["c"])
        np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-5 * np.sqrt(shape.k) * 4)
        assert np.array_equal(first.view(np.uint32), again.view(np.uint32)), implementation
        timings[implementation] = probe.time_product(shape, implementation)
    print("\n", shape.key(), {name: f"{seconds * 1e6:.0f} us" for name, seconds in timings.items()})


def test_stacked_and_unstacked_tiny_adam_on_the_gpu():
    from sexpgpu.lang.forms import parse_experiment, select_run
    from sexpgpu.lang.reader import read_text
    from sexpgpu.run.choosing import stacked_training
    from sexpgpu.run.loop import Stacking, Trainer
    from sexpgpu.run.setup import build_run

    path = ROOT / "examples" / "tiny-adam.sexp"
    text = path.read_text().replace(":batch 64", ":batch 16 :microbatches 4")
    experiment = select_run(parse_experiment(read_text(text, str(path)), str(path), ""), None)
    records, evaluations = {}, {}
    for degree in (1, 4):
        built = build_run(experiment, "cuda")
        state = built.initial_state()
        stacking = Stacking(stacked_training(built.program, degree), degree)
        trainer = Trainer(experiment.run, built.program, built.backend, built.feeder, stacking)
        records[degree] = [trainer.step(state) for _ in range(120)]
        pass_spec = experiment.run.passes[0]
        evaluations[degree] = trainer.evaluate(state, pass_spec, built.pass_name(pass_spec))
    pairs = list(zip(records[1], records[4]))
    first = next((one["step"] for one, four in pairs if one["loss_bits"] != four["loss_bits"]), None)
    gap = max(abs(one["loss"] - four["loss"]) for one, four in pairs[:20])
    print(f"\ntiny-adam on the GPU, stacking 4 against 1: the loss first differs at step {first}; "
          f"largest gap to step 20 {gap:.2e}; eval after 120 steps: stacking 1 {evaluations[1]}, "
          f"stacking 4 {evaluations[4]}")
    assert records[1][0]["loss"] == pytest.approx(records[4][0]["loss"], rel=1e-6)
    assert gap < 1e-3


def test_an_allocation_failure_is_e_mem_001_and_leaves_the_backend_usable():
    backend = CudaBackend()
    _, total = torch.cuda.mem_get_info()
    e = Emitter()
    x = e.input("x", "f32", (4,))
    huge = e("broadcast", e("reshape", x, shape=(1, 4)), shape=(total // 8, 4))  # twice the card
    graph = e.graph({"x": x}, {"y": e("exp", huge)})
    with pytest.raises(SexpgpuError) as raised:
        backend.run(graph, {"x": np.ones(4, np.float32)})
    assert raised.value.code == "E-MEM-001" and "memory: allocation failed" in raised.value.message
    small = Emitter()
    y = small.input("x", "f32", (4,))
    little = small.graph({"x": y}, {"y": small("exp", y)})
    np.testing.assert_allclose(backend.to_host(backend.run(little, {"x": np.zeros(4, np.float32)})["y"]), np.ones(4))
