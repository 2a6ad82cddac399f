"""The fused attention kernels on a GPU against the CPU interpreter, within the envelope of
tests/cuda/attention_checks.py (float32 results also against float64), each run twice for
the same bits: the GPU's own tiles (32 to 128 queries or keys), lengths that leave partial
tiles, float32 heads of 16, 32 and 64 (the widest fused one) and past it, bf16 heads of 64
and 128, a narrow head, one wider than the fused kernels take, and gpt-50m's head at its
context, with dS in memory (the lowering's choice while it fits) and without. The float32 kernels compile to the tensor cores' wgmma products with no register
spilled (docs/cuda.md, "Attention"). Then a small GPT of gpt-50m's form (heads 64 wide) run
twice from the command line writes the same metrics, and its float32 losses stay in the
CPU/GPU envelope.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_attention_gpu.py -m gpu
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from attention_checks import CPU, attention_case, check  # noqa: E402
from op_cases import case_graph  # noqa: E402
from gpu_driver import ENVELOPE_STEP, run_on_the_gpu, train  # noqa: E402

CASES = [
    ([(2, 8, 512, 64)] * 3, "f32", True),
    ([(2, 8, 512, 64)] * 3, "bf16", True),
    ([(2, 3, 257, 64)] * 3, "f32", False),
    ([(2, 3, 257, 64)] * 3, "bf16", False),
    ([(2, 4, 300, 16)] * 3, "f32", True),
    ([(2, 4, 129, 32)] * 3, "f32", False),
    ([(1, 2, 200, 96)] * 3, "f32", True),
    ([(1, 2, 193, 128)] * 3, "f32", True),
    ([(1, 2, 193, 128)] * 3, "bf16", True),
    ([(3, 100, 20), (3, 77, 20), (3, 77, 36)], "f32", False),
    ([(3, 100, 20), (3, 77, 20), (3, 77, 36)], "bf16", False),
    ([(1, 1, 1, 64)] * 3, "bf16", True),
    ([(1, 2, 70, 160)] * 3, "f32", True),
]

# gpt-50m's form (bench/gpt-50m.sexp) at a small size, with heads as wide as its (64)
SMALL_GPT = """
(defgenerator tokens :vocab 512 :context 128
  (let text (randint (batch 129) :low 0 :high vocab :salt (:step :trip)))
  (record :x (slice text :axis 1 :start 0 :stop context)
          :y (slice text :axis 1 :start 1 :stop 129)))

(defgraph block (x) :width 128 :heads 2 :ff 256
  (let attended (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (let hidden (gelu (linear (layernorm attended :as ln2) :out ff :as up)))
  (add attended (linear hidden :out width :as down)))

(defgraph gpt (x) :vocab 512 :context 128 :width 128 :heads 2 :ff 256 :layers 2
  (let tokens (embedding x :vocab vocab :dim width :as embed))
  (let positions (param positions (context width) :init (normal :std 0.02)))
  (let h (repeat layers block (add tokens positions) :as block :width width :heads heads :ff ff))
  (linear (layernorm h :as final-norm) :out vocab :as head))

(defrun small-gpt
  :seed 5
  :data (generator tokens)
  :model (gpt x)
  :loss (cross-entropy y)
  :optimizer (adamw :lr 0.001 :weight-decay 0.01 :clip 1.0)
  :batch 4
  :steps 6)
"""


@pytest.fixture(scope="module")
def backend():
    """The backend's own kernels: a policy given has no pattern graphs (cuDNN's attention is
    tests/cuda/test_patterns_gpu.py's)."""
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.cuda.fusion import policy_from_environment

    return CudaBackend(policy=policy_from_environment())


@pytest.mark.parametrize("shapes,dtype,causal", CASES, ids=lambda value: str(value).replace(" ", ""))
def test_fused_attention_on_the_gpu_matches_the_interpreter_and_repeats_its_bits(backend, shapes, dtype, causal):
    check(backend, shapes, dtype, causal)


@pytest.mark.parametrize("shapes,dtype,causal", CASES[:4], ids=lambda value: str(value).replace(" ", ""))
def test_attention_with_ds_over_its_budget_on_the_gpu(monkeypatch, shapes, dtype, causal):
    """backward_kv then backward_q recomputing the probabilities, the path of long sequences."""
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.cuda.codegen import attention as kernels
    from sexpgpu.backends.cuda.fusion import policy_from_environment

    monkeypatch.setattr(kernels, "MAX_DS_BYTES", 0)
    check(CudaBackend(policy=policy_from_environment()), shapes, dtype, causal)


@pytest.mark.parametrize("shapes", [[(2, 5, 64), (2, 1, 64), (2, 1, 31)], [(2049, 1, 64), (2049, 1, 64), (2049, 1, 31)]],
                         ids=["small", "seed 746"])
def test_one_hot_attention_rows_on_the_gpu_have_no_query_or_key_gradient(backend, shapes):
    """One key: every probability is 1 and dS = P (dO v^T - D) is 0 in the interpreter. D as
    the row sum of P times the kernels' own dO v^T (score_delta) leaves at most a rounding of
    dP; rowsum(dO * O) left about 2e-6 (the random graph of seed 746)."""
    from op_cases import assert_matches

    graph, values = case_graph(attention_case(shapes, "f32", False))
    want, got = CPU.run(graph, values), backend.run(graph, values)
    for name in ("grad0", "grad1"):
        assert not np.any(want[name]), name
        assert_matches(name, backend.to_host(got[name]), want[name], "f32")


@pytest.mark.parametrize("width", [16, 32, 64])
def test_the_float32_kernels_run_tensor_core_products_and_spill_no_register(width):
    from sexpgpu.backends.cuda.codegen import attention as kernels

    q, k, v, g = (torch.randn(1, 2, 130, width, device="cuda") for _ in range(4))
    lse, delta = (torch.empty(1, 2, 130, device="cuda") for _ in range(2))
    out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    kernels.run_forward(q, k, v, out, lse, 0.125, True)
    kernels.run_score_delta(q, k, v, g, lse, delta, 0.125, True)
    kernels.run_backward_kv(q, k, v, g, lse, delta, dk, dv, 0.125, True)
    kernels.run_backward_q(q, k, v, g, lse, delta, dq, 0.125, True)
    ds = torch.empty(1, 2, 130, 130, device="cuda")
    kernels.run_backward_kv(q, k, v, g, lse, delta, dk, dv, 0.125, True, ds)  # storing dS too
    kernels.run_backward_q_from_ds(ds, k, dq, 0.125, True)
    torch.cuda.synchronize()
    for function in (kernels.forward, kernels.score_delta, kernels.backward_kv, kernels.backward_q,
                     kernels.backward_q_from_ds):
        compiled = [kernel for kernel in _compiled(function)
                    if _constants(function, kernel)["BLOCK_E"] == width and not _constants(function, kernel)["BF16"]]
        assert compiled, function.__name__
        for kernel in compiled:
            assert "wgmma" in kernel.asm["ptx"] and kernel.n_spills == 0, (function.__name__, kernel.n_spills)


def _compiled(function) -> list:
    """The kernels `function` has compiled in this process (one still compiling waited for)."""
    kernels = [kernel for cache in function.device_caches.values() for kernel in cache[0].values()]
    return [kernel.result() if hasattr(kernel, "result") else kernel for kernel in kernels]


def _constants(function, kernel) -> dict:
    """A compiled kernel's constexpr arguments by name."""
    return {function.arg_names[path[0]]: value for path, value in kernel.src.constants.items()}


@pytest.fixture
def small_gpt(tmp_path) -> Path:
    path = tmp_path / "small-gpt.sexp"
    path.write_text(SMALL_GPT)
    return path


def test_a_small_gpt_run_twice_from_the_command_line_writes_the_same_metrics(small_gpt, tmp_path):
    runs = [run_on_the_gpu(small_gpt, tmp_path / f"run{attempt}") for attempt in range(2)]
    logs = [(run_dir / "metrics.jsonl").read_text() for run_dir in runs]
    assert logs[0] == logs[1] and len(logs[0].splitlines()) == 6


def test_a_small_gpt_on_the_gpu_stays_in_the_cpu_envelope(backend, small_gpt):
    from sexpgpu.backends.cpu import Interpreter
    from sexpgpu.lang.forms import load_experiment

    experiment = load_experiment(str(small_gpt))
    gpu, _ = train(experiment, backend, 6)
    cpu, _ = train(experiment, Interpreter(), 6)
    relative = np.abs(gpu - cpu) / np.abs(cpu)
    print(f"small GPT, float32: GPU losses within {relative.max():.2e} of the CPU's")
    assert relative.max() <= ENVELOPE_STEP
