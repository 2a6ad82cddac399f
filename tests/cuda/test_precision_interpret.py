"""`:precision bf16` through the CUDA lowering, run on the CPU by Triton's interpreter, against
the CPU interpreter: the rewritten graph's casts, bf16 products (matmul, attention's
products, convolutions and their cotangents) and float32 statistics, through the run loop.

The two backends sum the products in different orders, so a product's bf16 rounding may
land on the other neighbour: the losses agree within PRECISION_RTOL (docs/cuda.md, "Mixed
precision"), not bit for bit. tests/cuda/test_cuda_gpu.py repeats this on the device."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs tests/cuda/test_cuda_gpu.py instead
    pytest.skip("a GPU is present: the GPU tests check bf16 runs there", allow_module_level=True)
pytest.importorskip("triton")

from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py

PRECISION_RTOL = 1e-2  # a step's loss, CUDA lowering against the interpreter, in bf16

# one attention block over 8 bytes, and a convolution net on 6x6 images: every product kind
RUNS = {
    "attention": """
(defgraph block (x) :width 16 :heads 2
  (let attended (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (add attended (linear (gelu (linear (layernorm attended :as ln2) :out 32 :as up)) :out width :as down)))
(defgraph lm (x) :width 16
  (let h (add (embedding x :vocab 256 :dim width :as embed) (param pos (8 width) :init (normal :std 0.02))))
  (linear (layernorm (block h :as block0) :as norm) :out 256 :as head))
(defrun lm :seed 7 :data (text pydoc :context 8) :model (lm x) :loss (cross-entropy y)
  :optimizer (adamw :lr 0.003 :weight-decay 0.01 :clip 1.0) :batch 2 :steps 1 :precision bf16)
""",
    "convolution": """
(defgenerator pictures
  (record :x (normal (batch 1 6 6) :salt (:step :trip))
          :y (cast (bernoulli (batch) :p 0.5 :salt (:step :trip)) i32)))
(defgraph cnn (x)
  (let h (max-pool (relu (conv2d x :out 4 :kernel 3 :padding 1 :as conv1)) :kernel 2))
  (let pooled (avg-pool (relu (conv2d h :out 4 :kernel 3 :padding 1 :as conv2)) :kernel 3))
  (linear (reshape pooled (batch -1)) :out 2 :as head))
(defrun cnn :seed 5 :data (generator pictures) :model (cnn x) :loss (cross-entropy y)
  :optimizer (adam :lr 0.01) :batch 4 :microbatches 2 :steps 3 :precision bf16)
""",
}




def built_run(tmp_path, name: str):
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    path = tmp_path / f"{name}.sexp"
    path.write_text(RUNS[name])
    experiment = load_experiment(str(path))
    return experiment, build_run(experiment, "cpu")


def test_a_bf16_attention_step_gives_the_interpreters_loss_and_gradients(tmp_path):
    """One microbatch of the attention model: its loss, and each gradient as a whole (a
    flipped bf16 rounding moves single elements, not the vector)."""
    experiment, built = built_run(tmp_path, "attention")
    micro = built.program.training.micro
    assert {node.dtype for node in micro.nodes if node.op == "matmul"} == {"bf16"}
    values = {f"param/{path}": value for path, value in built.initial_state().params.items()}
    values.update(built.feeder.train_batch(1, 0))
    values.update({"step": np.int32(1), "microbatch": np.int32(0)})
    values = {name: values[name] for name in micro.inputs}
    backend = CudaBackend(device="cpu")
    got = {name: backend.to_host(value) for name, value in backend.run(micro, values).items()}
    want = built.backend.run(micro, values)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=PRECISION_RTOL)
    for name in want:
        assert np.linalg.norm(got[name] - want[name]) <= PRECISION_RTOL * np.linalg.norm(want[name]), name
    # and cuBLAS is handed bf16: every product reads and writes bf16 buffers
    lowered = backend.lowered(micro)
    products = [step for step in lowered.launches if step.kind == "matmul"]
    assert len(products) == sum(node.op == "matmul" for node in micro.nodes)
    assert all(lowered.buffers[key].dtype == "bf16" for step in products for key in step.reads + step.writes[:1])


def test_a_bf16_convolution_run_follows_the_interpreter(tmp_path):
    from sexpgpu.run.loop import Trainer

    losses = {}
    for device in ("cpu", "cuda"):
        experiment, built = built_run(tmp_path, "convolution")
        if device == "cuda":
            built.backend = CudaBackend(device="cpu")
            built.feeder.backend = built.backend
        state = built.initial_state()
        trainer = Trainer(experiment.run, built.program, built.backend, built.feeder)
        losses[device] = [trainer.step(state)["loss"] for _ in range(experiment.run.steps)]
    micro = built.program.training.micro
    products = [node for node in micro.nodes if node.op in ("matmul", "conv2d", "conv2d_input_grad", "conv2d_weight_grad")]
    assert products and all(node.dtype == "bf16" for node in products)
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=PRECISION_RTOL)
    # a bf16 product sums in float32 and rounds once, as the interpreter's does
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction is False
