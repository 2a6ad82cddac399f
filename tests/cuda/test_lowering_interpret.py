"""The CUDA lowering, run on the CPU by Triton's interpreter, against the CPU interpreter.

`CudaBackend(device="cpu")` lowers a graph exactly as on the GPU (the same fusion, kernels,
memory plan and PyTorch calls) and runs it on CPU tensors. What differs on a GPU is only the
reduction trees' arithmetic and cuBLAS: tests/cuda/test_cuda_gpu.py repeats these on the device.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs tests/cuda/test_cuda_gpu.py instead
    pytest.skip("a GPU is present: the GPU tests check these kernels there", allow_module_level=True)
pytest.importorskip("triton")

from op_cases import CASES, FORWARD_CASES, assert_matches, case_elements, case_graph, case_id, random_array  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda import views  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.fusion import FusionPolicy  # noqa: E402
from sexpgpu.plan.memory import Lifetime, plan_arena  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py



CPU = Interpreter()
SMALL_CASES = [case for case in CASES if case_elements(case) <= 200]


@pytest.fixture(scope="module")
def backend():
    return CudaBackend(device="cpu")


def compare(backend, graph, values):
    want = CPU.run(graph, values)
    got = backend.run(graph, values)
    for name in want:
        assert_matches(name, backend.to_host(got[name]), want[name], graph.outputs[name].dtype)
    return got


@pytest.mark.parametrize("case", SMALL_CASES, ids=case_id)
def test_op_and_its_gradient_match_the_interpreter(backend, case):
    compare(backend, *case_graph(case))


@pytest.mark.parametrize("case", FORWARD_CASES, ids=case_id)
def test_op_without_gradient_matches_the_interpreter(backend, case):
    compare(backend, *case_graph(case, differentiate=False))


EXACT = ["neg", "relu", "gelu", "tanh", "exp", "log", "sqrt", "rsqrt", "sigmoid", "square", "erf"]


@pytest.mark.parametrize("op", EXACT)
def test_elementwise_ops_give_the_interpreters_bits(backend, op):
    """No sum is involved, and the math functions are the portable ones: bit for bit."""
    kind = "positive" if op in ("log", "sqrt", "rsqrt") else "normal"
    for dtype in ("f32", "bf16"):
        graph, values = case_graph((op, [(dtype, (7, 9), kind)], {}), differentiate=False)
        got = backend.to_host(backend.run(graph, values)["y"])
        want = CPU.run(graph, values)["y"]
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def _mlp_training_graph():
    """A small MLP's loss and gradients: matmuls, a fused bias-relu chain, cross-entropy."""
    e = Emitter()
    x = e.input("x", "f32", (6, 5))
    labels = e.input("y", "i32", (6,))
    w1, b1 = e.input("w1", "f32", (8, 5)), e.input("b1", "f32", (8,))
    w2 = e.input("w2", "f32", (3, 8))
    hidden = e("relu", e("add", e("matmul", x, e("transpose", w1, perm=(1, 0))), b1))
    logits = e("matmul", hidden, e("transpose", w2, perm=(1, 0)))
    loss = e("div", e("sum", e("cross_entropy", logits, labels), axes=None), e.const(6.0))
    from sexpgpu.graph.training.autodiff import gradients

    grads = gradients(e, loss, [w1, b1, w2])
    inputs = {"x": x, "y": labels, "w1": w1, "b1": b1, "w2": w2}
    graph = e.graph(inputs, {"loss": loss, "g1": grads[0], "gb": grads[1], "g2": grads[2]})
    rng = np.random.default_rng(5)
    values = {name: random_array(rng, node.dtype, node.shape, "normal") for name, node in inputs.items()}
    values["y"] = rng.integers(0, 3, 6).astype(np.int32)
    return graph, values


def test_fusion_on_and_off_give_the_same_bits():
    """Fusion decides where a value is computed, never what it is: every node keeps its
    rounding, and a reduction's tree depends only on its length."""
    graph, values = _mlp_training_graph()
    fused = CudaBackend(device="cpu", policy=FusionPolicy("on"))
    unfused = CudaBackend(device="cpu", policy=FusionPolicy("off"))
    on, off = fused.run(graph, values), unfused.run(graph, values)
    for name in on:
        assert torch.equal(on[name], off[name]), name
    assert len(fused.lowered(graph).launches) < len(unfused.lowered(graph).launches)
    compare(fused, graph, values)


@pytest.mark.parametrize("rows", [6, 300])  # one chunk of rows, and partial sums of three
def test_an_elementwise_store_after_a_column_sum_of_its_space_joins_its_kernel(backend, rows, monkeypatch):
    """A bias gradient's sum and the cast of the same gradient: one kernel reads the operands
    once and gives both, with the bits of each kernel alone and the interpreter's."""
    from dataclasses import replace

    from sexpgpu.backends.cuda.codegen import columns

    monkeypatch.setattr(columns, "COLUMN_TILES", tuple(replace(tile, chunk_tiles=1) for tile in columns.COLUMN_TILES))
    e = Emitter()
    x = e.input("x", "f32", (rows, 24))
    gradient = e("mul", e("exp", x), x)
    graph = e.graph({"x": x}, {"bias": e("sum", gradient, axes=(0,)), "cast": e("neg", gradient)})
    values = {"x": random_array(np.random.default_rng(rows), "f32", (rows, 24), "normal")}
    lowered = backend.lowered(graph)
    # the gradient's elementwise kernel joined too: the column kernel computes it, and stores
    # only the cast, a graph output
    assert [launch.kind for launch in lowered.launches] == ["columns"]
    chunk = columns.tile_for(24, rows)[0]  # a chunk of one tile
    assert len(lowered.launches[0].writes) == 2 and lowered.launches[0].kernel.parts == -(-rows // chunk)
    joined = compare(backend, graph, values)
    apart = CudaBackend(device="cpu", policy=FusionPolicy("off")).run(graph, values)
    for name in apart:
        assert torch.equal(joined[name], apart[name]), name


def test_an_elementwise_chain_is_one_kernel(backend):
    e = Emitter()
    x, b = e.input("x", "f32", (4, 6)), e.input("b", "f32", (6,))
    y = e("tanh", e("mul", e("add", x, b), e("sigmoid", x)))
    graph = e.graph({"x": x, "b": b}, {"y": y})
    lowered = backend.lowered(graph)
    assert [step.kind for step in lowered.launches] == ["elementwise"]


def test_a_value_read_by_several_kernels_is_recomputed_within_the_budget():
    e = Emitter()
    x = e.input("x", "f32", (4, 6))
    cheap = e("add", x, x)  # 1 flop: recomputed by each reader
    costly = e("exp", e("exp", e("exp", e("exp", e("exp", x)))))  # 40 flops > 9 x 4 bytes: written once
    outputs = {"a": e("sum", cheap, axes=(1,)), "b": e("max", cheap, axes=(1,)),
               "c": e("sum", costly, axes=(1,)), "d": e("max", costly, axes=(1,))}
    graph = e.graph({"x": x}, outputs)
    kinds = [step.kind for step in CudaBackend(device="cpu").lowered(graph).launches]
    assert kinds.count("elementwise") == 1  # only `costly` is written out


def test_the_arena_never_overlaps_buffers_that_live_together():
    rng = np.random.default_rng(1)
    lives = []
    for index in range(60):
        born = int(rng.integers(0, 40))
        lives.append(Lifetime(f"b{index}", int(rng.integers(1, 5000)), born, born + int(rng.integers(0, 10))))
    plan = plan_arena(lives, alignment=256)
    for first in lives:
        for second in lives:
            if first.key >= second.key or first.dies < second.born or second.dies < first.born:
                continue
            a, b = plan.offsets[first.key], plan.offsets[second.key]
            assert a + first.nbytes <= b or b + second.nbytes <= a
    assert plan.arena_bytes <= sum(-(-life.nbytes // 256) * 256 for life in lives)


def test_reshape_strides_agree_with_torch_view():
    rng = np.random.default_rng(2)
    for _ in range(200):
        shape = tuple(int(size) for size in rng.integers(1, 4, rng.integers(1, 5)))
        base = torch.arange(int(np.prod(shape)) * 2).reshape(shape + (2,))[..., 0]
        perm = tuple(rng.permutation(len(shape)))
        source = base.permute(perm)
        target = tuple(int(size) for size in rng.permutation(list(source.shape)))
        ours = views.reshape_strides(tuple(source.shape), tuple(source.stride()), target)
        try:
            theirs = tuple(source.view(target).stride())
        except RuntimeError:
            theirs = None
        if ours is not None and theirs is not None:
            assert ours == theirs or torch.equal(source.reshape(target), source.as_strided(target, ours))
        assert (ours is None) == (theirs is None), (source.shape, source.stride(), target)


SMALL_RUN = """
(defgenerator teacher :width 3
  (let w (normal (width 2) :std 0.5))
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (matmul x w)))
(defgraph student (x) :hidden 5
  (linear (tanh (linear x :out hidden :as fc1)) :out 2 :as fc2))
(defrun small :seed 3 :data (generator teacher) :model (student x) :loss (mse y)
  :optimizer (adam :lr 0.01 :clip 1.0) :batch 4 :microbatches 2 :steps 3)
"""

# The head `linear :out 1` has a bias gradient summed over the batch into one column: a
# column kernel whose kept extent is 1, which once stored a block through a scalar pointer.
CNN_ONE_OUTPUT = """
(defgenerator spots :size 6
  (let x (normal (batch 1 size size) :salt (:step)))
  (record :x x :y (mean (reshape x (batch -1)) :axis 1 :keep true)))
(defgraph cnn (x) :width 3
  (let h (max-pool (relu (conv2d x :out width :kernel 3 :padding 1 :as conv)) :kernel 2))
  (linear (reshape h (batch -1)) :out 1 :as head))
(defrun cnn :seed 7 :data (generator spots) :model (cnn x) :loss (mse y)
  :optimizer (adam :lr 0.01) :batch 4 :steps 2)
"""


@pytest.mark.parametrize("text, steps", [(SMALL_RUN, 3), (CNN_ONE_OUTPUT, 2)], ids=["mlp", "cnn-one-output"])
def test_a_small_training_run_follows_the_interpreter(tmp_path, text, steps):
    """A generator, microbatches, Adam (with clipping), through the run loop on each backend:
    the losses agree to float32 rounding of differently ordered sums."""
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.loop import Trainer
    from sexpgpu.run.setup import build_run

    path = tmp_path / "small.sexp"
    path.write_text(text)
    experiment = load_experiment(str(path))
    losses = {}
    for device in ("cpu", "cuda"):
        built = build_run(experiment, "cpu")
        if device == "cuda":
            built.backend = CudaBackend(device="cpu")
            built.feeder.backend = built.backend
        state = built.initial_state()
        trainer = Trainer(experiment.run, built.program, built.backend, built.feeder)
        losses[device] = [trainer.step(state)["loss"] for _ in range(steps)]
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-5)


def test_an_op_without_a_cuda_lowering_is_a_clear_error():
    from sexpgpu.backends.cuda.fusion import policy_from_environment
    from sexpgpu.backends.cuda.lowering import Lowerer
    from sexpgpu.errors import Location, SexpgpuError
    from sexpgpu.graph.core.ir import Node, make_graph

    x = Node("input", "f32", (2, 3))
    odd = Node("frobnicate", "f32", (2, 3), (x,), loc=Location("f.sexp", 4, 7))
    graph = make_graph({"x": x}, {"y": odd}, [x, odd])
    with pytest.raises(SexpgpuError) as error:
        Lowerer(graph, policy_from_environment()).schedule()
    assert error.value.code == "E-DEVICE-002" and "frobnicate" in error.value.message
    assert str(error.value.location) == "f.sexp:4:7"


def test_an_unknown_optimize_level_is_refused(monkeypatch):
    from sexpgpu.backends.cuda.fusion import policy_from_environment
    from sexpgpu.errors import SexpgpuError

    monkeypatch.setenv("SEXPGPU_OPTIMIZE", "max")
    with pytest.raises(SexpgpuError) as error:
        policy_from_environment()
    assert error.value.code == "E-CONFIG-001" and "on, off" in error.value.message


def test_the_loss_kernel_gives_its_gradient_the_softmax():
    """Cross-entropy's kernel stores exp(x - max) and its row sums as it folds them, so the
    gradient's softmax costs no second kernel over the logits (and the bits stay: see
    test_fusion_on_and_off_give_the_same_bits, whose graph is this one)."""
    graph, _ = _mlp_training_graph()
    fused = [step.kind for step in CudaBackend(device="cpu", policy=FusionPolicy("on")).lowered(graph).launches]
    unfused = [step.kind for step in CudaBackend(device="cpu", policy=FusionPolicy("off")).lowered(graph).launches]
    assert fused.count("cross-entropy") == unfused.count("cross-entropy") == 1
    assert fused.count("rows") == 1 and unfused.count("rows") == 2  # the loss's sum; unfused also the softmax


def test_a_value_read_through_two_views_is_written_once(backend):
    """Two products read one computed value, one of them flattened: the value is written
    once, in its own shape, and the flattened reader gets a view of it."""
    e = Emitter()
    x, w = e.input("x", "f32", (2, 3, 4)), e.input("w", "f32", (4, 5))
    y = e("mul", x, x)  # cheap: the planner would have each reader recompute it
    flattened = e("reshape", y, shape=(6, 4))  # viewed before either product reads it
    flat = e("matmul", flattened, w)
    whole = e("matmul", y, w)
    graph = e.graph({"x": x, "w": w}, {"whole": whole, "flat": flat})
    written = [step for step in backend.lowered(graph).launches if step.kind == "elementwise"]
    assert len(written) == 1
    rng = np.random.default_rng(2)
    compare(backend, graph, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
                             "w": rng.standard_normal((4, 5)).astype(np.float32)})
