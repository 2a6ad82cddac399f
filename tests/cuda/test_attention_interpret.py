"""The fused attention kernels (backends/cuda/codegen/attention.py) under Triton's
interpreter against the CPU interpreter: forward and both cotangents, causal or not, float32
and bf16, lengths that leave partial blocks, one query, different q and k lengths, the
float32 head widths up to the widest fused one (64) and past it, and a head wider than the
fused kernels take (attention_wide.py); float32 results against float64 too; two runs give
the same bits. Under the interpreter the kernels split float32 operands into their tf32
parts themselves, as Triton's tf32x3 does on the GPU (the interpreter ignores
input_precision), so the checks see the terms 3xTF32 drops.
tests/cuda/test_attention_gpu.py repeats these on the GPU with its own tiles."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs tests/cuda/test_attention_gpu.py instead
    pytest.skip("a GPU is present: the GPU test checks these kernels there", allow_module_level=True)
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402  (kernels are decorated in the tests, under the interpreter)

from attention_checks import attention_case, check  # noqa: E402
from op_cases import case_graph  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")
CPU = Interpreter()  # tests/cuda/conftest.py

CASES = [
    ([(2, 3, 19, 4)] * 3, "f32", True),
    ([(2, 7, 4), (2, 33, 4), (2, 33, 5)], "f32", False),
    ([(2, 2, 21, 8)] * 3, "bf16", True),
    ([(1, 17, 4), (1, 9, 4), (1, 9, 6)], "bf16", False),
    ([(1, 1, 1, 4)] * 3, "f32", True),
    ([(3, 5, 6)] * 3, "f32", True),
    ([(1, 23, 16)] * 3, "f32", True),
    ([(1, 27, 32)] * 3, "f32", False),
    ([(1, 35, 64)] * 3, "f32", True),
    ([(1, 6, 96)] * 3, "f32", True),
    ([(1, 5, 130), (1, 6, 130), (1, 6, 3)], "f32", False),
    ([(1, 6, 130)] * 3, "bf16", True),
    # several of the GPU's key blocks (float32 128 keys, bf16 64), the last one partial
    ([(1, 2, 150, 8)] * 3, "f32", True),
    ([(1, 20, 8), (1, 200, 8), (1, 200, 8)], "f32", False),
    ([(1, 2, 75, 8)] * 3, "bf16", True),
]


@pytest.fixture(scope="module")
def backend():
    return CudaBackend(device="cpu")


@pytest.mark.parametrize("shapes,dtype,causal", CASES, ids=lambda value: str(value).replace(" ", ""))
def test_fused_attention_matches_the_interpreter_and_repeats_its_bits(backend, shapes, dtype, causal):
    check(backend, shapes, dtype, causal)


def test_wide_heads_with_large_scores_normalise_as_the_interpreter_does(backend):
    """Unscaled scores of 1000-wide heads reach tens (a random graph's, seed 1098): their
    probabilities taken as exp(s - lse) carried lse's rounding into the whole row, outside
    the float32 envelope; a softmax of the scores keeps within it."""
    check(backend, [(1, 7, 1000), (1, 7, 1000), (1, 7, 64)], "f32", False, scale=1.0)


@pytest.mark.parametrize("shape", [(1, 2, 40, 16), (1, 2, 20, 96)], ids=["fused", "wide"])
def test_the_attention_bench_runs_both_backward_paths_to_the_same_gradients(shape):
    """bench/bench_attention.py's `fused`, on CPU tensors under the interpreter: dS in memory
    and backward_q recomputing give gradients within float32 rounding of each other (a head
    too wide for the fused kernels takes attention_wide.py either way)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import bench_attention

    generator = torch.Generator().manual_seed(3)
    q, k, v, g = (torch.randn(shape, generator=generator) for _ in range(4))
    kept = bench_attention.fused(q, k, v, g, True)
    recomputed = bench_attention.fused(q, k, v, g, True, ds_in_memory=False)
    for a, b in zip(kept, recomputed):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


ONE_HOT = {
    "wide, one key": ([(2, 5, 200), (2, 1, 200), (2, 1, 200)], None),
    "fused, one key": ([(2, 5, 64), (2, 1, 64), (2, 1, 31)], None),  # the random graph of seed 746
}


@pytest.mark.parametrize("shapes,scale", ONE_HOT.values(), ids=ONE_HOT.keys())
def test_one_hot_attention_rows_have_no_query_or_key_gradient(backend, shapes, scale):
    """One key: every probability is 1, dS = P (dO v^T - D) is exactly 0, and so are the gradients of q and k, as the
    interpreter gives them. Both kernels' D is the row sum of P times the very products dS
    subtracts it from (score_delta, attention_wide.py); D as rowsum(dO * O), another sum over
    the forward's 3xTF32 output, left them about 2^-22 |dO| |O| apart."""
    graph, values = case_graph(attention_case(shapes, "f32", False, scale=scale))
    got = backend.run(graph, values)
    want = CPU.run(graph, values)
    for name in ("grad0", "grad1"):
        assert not np.any(want[name]) and not np.any(backend.to_host(got[name])), name


def test_float32_attention_lowers_to_the_fused_kernels_without_the_scores_in_memory(monkeypatch):
    """No buffer of the T x T scores, no product: the attention steps and the loss's own;
    with dS over its budget, no T x T buffer at all (memory linear in T)."""
    from sexpgpu.backends.cuda.codegen import attention as kernels

    length = 40
    graph, _ = case_graph(attention_case([(2, 3, length, 16)] * 3, "f32", True))
    lowered = CudaBackend(device="cpu").lowered(graph)
    kinds = {step.kind for step in lowered.launches}
    assert "attention" in kinds and "matmul" not in kinds, kinds
    square = [key for key, buffer in lowered.buffers.items() if buffer.shape[-2:] == (length, length)]
    writers = [step for step in lowered.launches if set(square) & set(step.writes)]
    assert len(square) == 1 and len(writers) == 1 and writers[0].kind == "attention", square  # dS, from the dK/dV kernel
    monkeypatch.setattr(kernels, "MAX_DS_BYTES", 2 * 3 * length * length * 4 - 1)
    lowered = CudaBackend(device="cpu").lowered(graph)
    assert all(buffer.shape[-2:] != (length, length) for buffer in lowered.buffers.values())


@pytest.mark.parametrize("shapes,dtype,causal", CASES[:4] + CASES[-3:], ids=lambda value: str(value).replace(" ", ""))
def test_attention_with_ds_over_its_budget_matches_the_interpreter(backend, monkeypatch, shapes, dtype, causal):
    """backward_kv then backward_q, each recomputing the probabilities: the path of long sequences."""
    from sexpgpu.backends.cuda.codegen import attention as kernels

    monkeypatch.setattr(kernels, "MAX_DS_BYTES", 0)
    check(CudaBackend(device="cpu"), shapes, dtype, causal)


def _parts(X, BIG, SMALL, DOT, PARTS: tl.constexpr, PRODUCT: tl.constexpr, BLOCK: tl.constexpr):
    """x's tf32 parts, and x times the identity as the interpreted kernels multiply."""
    rows = tl.arange(0, BLOCK)
    at = rows[:, None] * BLOCK + rows[None, :]
    x = tl.load(X + at)
    big, small = PARTS(x)
    tl.store(BIG + at, big)
    tl.store(SMALL + at, small)
    tl.store(DOT + at, PRODUCT(x, tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)))


# one attention layer between an embedding and a head, float32: the heads are split from the
# projections and merged back before `wo`, as the attention layer does
LAYER = """
(defgenerator tokens :vocab 16 :context 6
  (let text (randint (batch 7) :low 0 :high vocab :salt (:step :trip)))
  (record :x (slice text :axis 1 :start 0 :stop context)
          :y (slice text :axis 1 :start 1 :stop 7)))
(defgraph lm (x) :width 16 :heads 2
  (let h (add (embedding x :vocab 16 :dim width :as embed) (param pos (6 width) :init (normal :std 0.02))))
  (linear (add h (attention (layernorm h :as ln) :heads heads :as attn)) :out 16 :as head))
(defrun lm :seed 3 :data (generator tokens) :model (lm x) :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1) :batch 2 :steps 1)
"""


def test_an_attention_layer_follows_the_interpreter_and_its_products_read_the_results_where_written(backend, tmp_path):
    """A microbatch's loss and gradients within op_cases' float32 tolerance; the output, dq,
    dk and dv are written laid out as the heads merge reads them, so no kernel copies them."""
    from op_cases import assert_matches
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    path = tmp_path / "layer.sexp"
    path.write_text(LAYER)
    built = build_run(load_experiment(str(path)), "cpu")
    micro = built.program.training.micro
    values = {f"param/{name}": value for name, value in built.initial_state().params.items()}
    values.update(built.feeder.train_batch(1, 0))
    values.update({"step": np.int32(1), "microbatch": np.int32(0)})
    values = {name: values[name] for name in micro.inputs}
    want = built.backend.run(micro, values)
    got = backend.run(micro, values)
    for name in want:
        assert_matches(name, backend.to_host(got[name]), want[name], "f32")
    lowered = backend.lowered(micro)
    written = {key for step in lowered.launches if step.kind == "attention" for key in step.writes}
    readers = {step.kind for step in lowered.launches for key in step.reads if key in written}
    assert readers <= {"attention", "matmul"}, readers


def test_the_interpreted_kernels_split_float32_operands_as_tf32x3_does():
    """tf32 parts: big is rounded to nearest with ties away from zero at 10 fraction bits,
    small is the rest with its low 13 bits dropped; a product of parts drops small x small,
    so 1 + 2^-11 + 2^-23 times one comes out as 1 + 2^-11 + 2^-22 (small's 12th bit lost)."""
    special = [1 + 2**-11, -(1 + 2**-11), 1 + 2**-11 + 2**-23, 1 + 2**-11 - 2**-23, 3.0, -0.0, 2**-140,
               np.inf, -np.inf, np.nan, float(np.finfo(np.float32).max), 1 / 3]
    values = np.zeros((16, 16), dtype=np.float32)
    values[range(len(special)), range(len(special))] = special  # x times the identity keeps each row's own
    x = torch.from_numpy(values)
    big, small, dot = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    from sexpgpu.backends.cuda.codegen.attention import _dot_3xtf32, _tf32_parts

    triton.jit(_parts)[(1,)](x, big, small, dot, _tf32_parts, _dot_3xtf32, 16)
    bits = values.view(np.uint32).astype(np.uint64)
    want_big = (((bits + 0x1000) >> 13) << 13).astype(np.uint32).view(np.float32)
    want_big = np.where(np.isnan(values), values, want_big)
    with np.errstate(invalid="ignore", over="ignore"):
        rest = (values - want_big).view(np.uint32)
    want_small = ((rest >> 13) << 13).view(np.float32)
    np.testing.assert_array_equal(big.numpy(), want_big)
    np.testing.assert_array_equal(small.numpy(), want_small)
    assert big.numpy()[0, 0] == 1 + 2**-10 and big.numpy()[1, 1] == -(1 + 2**-10)  # ties away from zero
    assert dot.numpy()[2, 2] == np.float32(1 + 2**-11 + 2**-22)
    assert dot.numpy()[4, 4] == 3.0 and dot.numpy()[7, 7] == np.inf  # an infinite part: its NaN cleared


def test_a_batch_of_more_heads_than_one_grid_holds_runs_in_several_launches(backend, monkeypatch):
    """A grid's second axis holds at most 65535 programs, one a (batch, head): with the limit
    lowered to 2, the 6 heads of (2, 3, ...) run in three launches a kernel, each from its own
    first head, and give what one launch gives (the interpreter and the repeat, in `check`)."""
    from sexpgpu.backends.cuda.codegen import attention as kernels

    monkeypatch.setattr(kernels, "MAX_GRID_Y", 2)
    assert kernels._lead_chunks(6) == [(0, 2), (2, 2), (4, 2)] and kernels._lead_chunks(5)[-1] == (4, 1)
    check(CudaBackend(device="cpu"), [(2, 3, 19, 4)] * 3, "f32", True)
    check(CudaBackend(device="cpu"), [(2, 2, 21, 8)] * 3, "bf16", True)
