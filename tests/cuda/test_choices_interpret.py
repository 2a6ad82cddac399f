"""The plan's choices the CUDA backend executes, under Triton's interpreter on the CPU: each
implementation of a long float32 product (products.py), and the recompute budget."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - tests/cuda/test_mechanisms_gpu.py runs these on the device
    pytest.skip("a GPU is present: the GPU tests check these there", allow_module_level=True)
pytest.importorskip("triton")

from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.fusion import FusionPolicy  # noqa: E402
from sexpgpu.backends.cuda.products import implementations  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402
from sexpgpu.plan.device import ProductShape  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py




M, N, K = 8, 6, 1024
ALL = ("ordinary", "transposed", "split-k 2", "split-k 4")


def _product_graph(batch: int = 0, b_transposed: bool = False):
    e = Emitter()
    lead = (batch,) if batch else ()
    a = e.input("a", "f32", lead + (M, K))
    b = e.input("b", "f32", lead + ((N, K) if b_transposed else (K, N)))
    right = e("transpose", b, perm=tuple(range(len(lead))) + (len(lead) + 1, len(lead))) if b_transposed else b
    return e.graph({"a": a, "b": b}, {"c": e("matmul", a, right)})


def _values(graph, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(node.shape).astype(np.float32) for name, node in graph.inputs.items()}


def _run(graph, values, key: str, implementation: str):
    backend = CudaBackend(device="cpu", policy=FusionPolicy("on", products={key: implementation}))
    (step,) = [step for step in backend.lowered(graph).launches if step.kind == "matmul"]
    assert len(step.writes) == (1 if implementation == "ordinary" else 2)  # the scratch the plan's choice needs
    return backend.to_host(backend.run(graph, values)["c"])


CASES = [
    ("matrix", dict(), ProductShape(M, N, K)),
    ("batched", dict(batch=3), ProductShape(M, N, K, batch=3)),
    ("transposed operand", dict(b_transposed=True), ProductShape(M, N, K, b_transposed=True)),
]


@pytest.mark.parametrize("implementation", ALL)
@pytest.mark.parametrize("name, options, shape", CASES, ids=[case[0] for case in CASES])
def test_each_implementation_is_a_float32_product_and_repeats_its_bits(name, options, shape, implementation):
    graph = _product_graph(**options)
    values = _values(graph)
    right = values["b"].astype(np.float64)
    want = values["a"].astype(np.float64) @ (np.swapaxes(right, -1, -2) if options.get("b_transposed") else right)
    first = _run(graph, values, shape.key(), implementation)
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=2e-5 * np.sqrt(K))
    again = _run(graph, values, shape.key(), implementation)
    np.testing.assert_array_equal(first.view(np.uint32), again.view(np.uint32))


@pytest.mark.parametrize("parts", [2, 4])
def test_split_k_sums_its_partial_products_in_one_fixed_order(parts):
    graph = _product_graph()
    values = _values(graph, seed=2)
    got = _run(graph, values, ProductShape(M, N, K).key(), f"split-k {parts}")
    a, b = torch.from_numpy(values["a"]), torch.from_numpy(values["b"])
    width = K // parts
    partials = [torch.mm(a[:, i * width:(i + 1) * width], b[i * width:(i + 1) * width]).numpy() for i in range(parts)]
    total = partials[0]
    for partial in partials[1:]:
        total = np.float32(total + partial)  # ((p0 + p1) + p2) + p3, in float32
    np.testing.assert_array_equal(got.view(np.uint32), total.view(np.uint32))


def test_the_backend_offers_splits_only_where_k_is_divisible_and_long():
    assert ProductShape(4096, 512, 2048).key() == "1x4096x512x2048 NN"  # as docs/cuda.md shows a key
    assert implementations(ProductShape(8, 8, 1024)) == ALL
    assert implementations(ProductShape(8, 8, 512)) == ("ordinary", "transposed", "split-k 2")
    assert implementations(ProductShape(8, 8, 1001)) == implementations(ProductShape(8, 8, 300)) == ("ordinary", "transposed")
    graph = _product_graph()
    with pytest.raises(ValueError, match="'split-k 8' is not one of"):
        CudaBackend(device="cpu", policy=FusionPolicy(products={ProductShape(M, N, K).key(): "split-k 8"})).lowered(graph)


def test_a_shape_the_map_does_not_name_is_ordinary():
    graph = _product_graph()
    values = _values(graph)
    other = CudaBackend(device="cpu", policy=FusionPolicy(products={ProductShape(M, N, 2048).key(): "split-k 4"}))
    default = CudaBackend(device="cpu")
    assert [len(step.writes) for step in other.lowered(graph).launches] == [1]
    np.testing.assert_array_equal(other.to_host(other.run(graph, values)["c"]), default.to_host(default.run(graph, values)["c"]))


def test_the_recompute_budget_is_the_policys_and_moves_only_where_values_are_computed():
    e = Emitter()
    x = e.input("x", "f32", (4, 6))
    middling = e("exp", x)  # beyond 9 flops a byte, within 20
    outputs = {"a": e("sum", middling, axes=(1,)), "b": e("max", middling, axes=(1,))}
    graph = e.graph({"x": x}, outputs)
    values = {"x": np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)}
    results = {}
    for budget, written in ((20.0, 0), (9.0, 1)):
        backend = CudaBackend(device="cpu", policy=FusionPolicy("on", budget))
        assert [step.kind for step in backend.lowered(graph).launches].count("elementwise") == written
        results[budget] = {name: backend.to_host(value) for name, value in backend.run(graph, values).items()}
    for name in outputs:
        np.testing.assert_array_equal(results[9.0][name].view(np.uint32), results[20.0][name].view(np.uint32))
    assert CudaBackend(device="cpu").policy.budget == 9.0
    with pytest.raises(ValueError, match="positive number of flops a byte"):
        FusionPolicy("on", 0.0)


def test_the_probes_product_graph_has_the_shape_it_times():
    from sexpgpu.backends.cuda.probe import product_graph

    for shape in (ProductShape(M, N, 512), ProductShape(M, N, 512, batch=3, a_transposed=True),
                  ProductShape(M, N, 512, b_transposed=True)):
        backend = CudaBackend(device="cpu", policy=FusionPolicy(products={shape.key(): "split-k 2"}))
        (step,) = backend.lowered(product_graph(shape)).launches[-1:]
        assert step.kind == "matmul" and len(step.writes) == 2  # the map's key matched the lowered product


def test_the_probes_memory_grows_with_the_stacking_degree():
    from sexpgpu.backends.cuda.probe import CudaProbe
    from sexpgpu.graph import compile_program
    from sexpgpu.lang.forms import parse_experiment, select_run
    from sexpgpu.lang.reader import read_text

    text = """
(defgraph net (x) (linear (tanh (linear x :out 64 :as fc)) :out 3 :as head))
(defrun r :seed 9 :data (records "d.npz") :model (net x) :loss (cross-entropy y)
  :optimizer (adam :lr 0.1) :batch 32 :microbatches 4 :steps 1)
"""
    experiment = select_run(parse_experiment(read_text(text, "t.sexp"), "t.sexp", ""), None)
    program = compile_program(experiment, {"x": ((16,), "f32"), "y": ((), "i32")})
    probe = CudaProbe(CudaBackend(device="cpu"))
    peaks = [probe.training_peak_bytes(program.training, degree) for degree in (1, 2, 4)]
    assert peaks[0] < peaks[1] < peaks[2]
    stacked_fields = 4 * 32 * (16 + 1) * 4  # four microbatches of x and y in the stacked call's inputs
    assert peaks[2] - peaks[0] >= stacked_fields - 32 * 17 * 4


def test_the_probe_lists_a_graphs_float32_products_once_each():
    from sexpgpu.backends.cuda.probe import CudaProbe

    e = Emitter()
    a, b = e.input("a", "f32", (2, M, K)), e.input("b", "f32", (K, N))
    half = e.input("h", "bf16", (M, K))
    first = e("matmul", a, b)
    again = e("matmul", e("neg", a), b)
    rounded = e("matmul", half, e("cast", b, dtype="bf16"))
    graph = e.graph({"a": a, "b": b, "h": half}, {"c": first, "d": again, "r": rounded})
    shapes = CudaProbe(CudaBackend(device="cpu")).product_shapes(graph)
    assert shapes == (ProductShape(2 * M, N, K),)  # the rows fold; the bf16 product has no choice


STACKED_RUN = """
(defgraph net (x)
  (let h (dropout (tanh (linear x :out 6 :as fc)) :p 0.25 :salt :step))
  (linear (add h (normal (batch 6) :std 0.1)) :out 3 :as head))
(defrun r :seed 9 :data (records "d.npz") :model (net x) :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1) :batch 2 :microbatches 4 :steps 1)
"""


def test_the_cuda_backend_runs_a_stacked_graph_as_the_interpreter_does():
    from sexpgpu.backends.cpu import Interpreter
    from sexpgpu.graph import compile_program
    from sexpgpu.graph.training.stacking import stack_training
    from sexpgpu.lang.forms import parse_experiment, select_run
    from sexpgpu.lang.reader import read_text

    experiment = select_run(parse_experiment(read_text(STACKED_RUN, "t.sexp"), "t.sexp", ""), None)
    program = compile_program(experiment, {"x": ((3,), "f32"), "y": ((), "i32")})
    micro = stack_training(program.training, 4).micro
    rng = np.random.default_rng(4)
    values = {name: (rng.integers(0, 3, node.shape).astype(np.int32) if node.dtype == "i32"
                     else rng.standard_normal(node.shape).astype(np.float32))
              for name, node in micro.inputs.items() if name != "step"}
    values["step"] = np.int32(3)
    want = Interpreter().run(micro, values)
    backend = CudaBackend(device="cpu")
    got = {name: backend.to_host(value) for name, value in backend.run(micro, values).items()}
    assert got["loss"].shape == (4,)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_a_pinned_stacked_runs_products_are_the_keys_its_lowered_steps_look_up():
    """The plan names each product as the backend lowers it at the pinned degree (rows folded,
    the stacked M), so what the plan decided is what the step runs."""
    from sexpgpu.backends.cuda.probe import CudaProbe
    from sexpgpu.graph import compile_program
    from sexpgpu.graph.training.stacking import stack_training
    from sexpgpu.lang.forms import parse_experiment, select_run
    from sexpgpu.lang.reader import read_text
    from sexpgpu.plan.choices import Choices, Situation, take_pinned

    from fake_device import H200

    experiment = select_run(parse_experiment(read_text(STACKED_RUN, "t.sexp"), "t.sexp", ""), None)
    program = compile_program(experiment, {"x": ((3,), "f32"), "y": ((), "i32")})
    backend = CudaBackend(device="cpu")
    probe = CudaProbe(backend)
    probe.device_facts = lambda: H200  # the record's device line; a CPU has no CUDA facts to read
    situation = Situation(probe, program.training, True, 4, "bf16", offered=(1, 2, 4))
    situation.free_bytes = 1 << 40
    recorded = Choices("anywhere", False, 2, 9.0, {}, None, "bf16")
    products = take_pinned(situation, recorded, "a record").products
    stacked = stack_training(program.training, 2)
    lowered = {step.product.key() for graph in stacked.graphs for step in backend.lowered(graph).launches
               if getattr(step, "product", None)}
    assert lowered and lowered <= set(products)


def test_the_backends_own_level_line_claims_the_cache_only_where_it_can_remember(monkeypatch, tmp_path):
    """`sexpgpu check --device cuda` prints the backend's own level line: level 1 with
    ~/.cache/sexpgpu where a run could remember its measurements, else this run's only."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert CudaBackend(device="cpu").facts()["determinism"].startswith(
        "1: this machine repeats these bits with this binary and ~/.cache/sexpgpu")
    monkeypatch.delenv("HOME")
    assert CudaBackend(device="cpu").facts()["determinism"].startswith(
        "1 within this run only: HOME is unset, so there is no ~/.cache/sexpgpu, so what it measured is not remembered")
    (tmp_path / "home").mkdir()
    (tmp_path / "home/.cache").write_text("a file where the cache's folder belongs")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert CudaBackend(device="cpu").facts()["determinism"].startswith(
        f"1 within this run only: {tmp_path}/home/.cache/sexpgpu cannot be written, so what it measured")
