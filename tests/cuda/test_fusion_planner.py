"""The fusion planner's choices (fusion.py) and the row-kernel merges (rowmerge.py): where
values are computed changes, never what they are.

Each graph is lowered fused (SEXPGPU_OPTIMIZE=on) and unfused (off: one kernel per node, the
lowering before any of these choices) and run under Triton's interpreter on the CPU: the
outputs must be equal bit for bit, and the fused lowering must have the kernels the planner
promises. Shapes are tiny to keep CI fast; a row of 40 elements is one chunk, a row of
2100 is read in chunks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - the GPU tests cover the kernels there
    pytest.skip("a GPU is present: these run under Triton's interpreter only", allow_module_level=True)
pytest.importorskip("triton")

from op_cases import random_array  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.fusion import STORE_RULES, FusionPolicy, KernelReaders, loaded_bytes, recompute_rule  # noqa: E402
from sexpgpu.backends.cuda.codegen.expr import load  # noqa: E402
from sexpgpu.backends.cuda.codegen.space import broadcast_view, contiguous  # noqa: E402
from sexpgpu.graph.training.autodiff import gradients  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py




FUSED = CudaBackend(device="cpu", policy=FusionPolicy("on"))
UNFUSED = CudaBackend(device="cpu", policy=FusionPolicy("off"))


def assert_same_bits(graph, values) -> None:
    on, off = FUSED.run(graph, values), UNFUSED.run(graph, values)
    for name in off:
        got, want = FUSED.to_host(on[name]), UNFUSED.to_host(off[name])
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name


def kinds(graph) -> list[str]:
    return [step.kind for step in FUSED.lowered(graph).launches]


def differentiated(build, shapes: dict, dtype: str = "f32", seed: int = 0):
    """(graph, values): loss = sum(build(...) * w) and the gradients of every input."""
    e = Emitter()
    inputs = {name: e.input(name, dtype, shape) for name, shape in shapes.items()}
    y = build(e, **inputs)
    w = e.input("w", dtype, y.shape)
    loss = e("sum", e("mul", y, w), axes=None)
    grads = gradients(e, loss, list(inputs.values()))
    outputs = {"loss": loss, "y": y}
    outputs.update({f"d{name}": grad for name, grad in zip(inputs, grads)})
    inputs["w"] = w
    rng = np.random.default_rng(seed)
    values = {name: random_array(rng, node.dtype, node.shape, "normal") for name, node in inputs.items()}
    return e.graph(inputs, outputs), values


# --- row kernels and their consumers --------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_softmax_gradient_is_one_row_kernel_with_the_same_bits(dtype):
    """inner = sum(g P) and P (g - inner) share one kernel reading g and P once."""
    graph, values = differentiated(lambda e, x: e("softmax", x, axis=-1), {"x": (3, 4, 40)}, dtype)
    assert_same_bits(graph, values)
    steps = FUSED.lowered(graph).launches
    gradient_rows = [step for step in steps if step.kind == "rows"][-1]
    assert "dx" not in [step.kind for step in steps]
    assert len(gradient_rows.kernel.spec.phases) == 2  # the sum, then the elementwise store
    assert kinds(graph).count("elementwise") < kinds_unfused(graph).count("elementwise")


def kinds_unfused(graph) -> list[str]:
    return [step.kind for step in UNFUSED.lowered(graph).launches]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_layernorm_gradient_statistics_and_result_are_one_kernel(dtype):
    graph, values = differentiated(lambda e, x: e("layernorm", x, eps=1e-5), {"x": (2, 3, 40)}, dtype)
    assert_same_bits(graph, values)
    # the normalisation, the loss's sum, and the whole gradient: statistics, sum(g),
    # sum(g y), the per-row values and dx
    assert kinds(graph) == ["rows", "rows", "rows"]
    assert len(kinds_unfused(graph)) > 15


def test_long_rows_merge_only_reductions_that_read_nothing_of_the_kernel():
    """Rows of 2100 elements are read in chunks: sum(x) and max(x) share a pass; the
    gradient's second pass over the rows stays a kernel of its own."""
    e = Emitter()
    x = e.input("x", "f32", (3, 2100))
    total, top = e("sum", x, axes=(1,), keep=True), e("max", x, axes=(1,), keep=True)
    centered = e("sub", x, e("div", total, e.const(2100.0)))
    spread = e("sum", e("mul", centered, centered), axes=(1,))
    graph = e.graph({"x": x}, {"total": total, "top": top, "spread": spread, "centered": centered})
    values = {"x": np.random.default_rng(3).normal(size=(3, 2100)).astype(np.float32)}
    assert_same_bits(graph, values)
    rows = [step for step in FUSED.lowered(graph).launches if step.kind == "rows"]
    assert len(rows[0].kernel.spec.phases[0].reductions) == 2
    assert len(rows) == 2


def test_reductions_over_other_rows_stay_apart():
    """A sum over the last axis and one over a transposed view do not share rows."""
    e = Emitter()
    x = e.input("x", "f32", (4, 6))
    a = e("sum", x, axes=(1,))
    b = e("sum", e("transpose", x, perm=(1, 0)), axes=(1,))
    graph = e.graph({"x": x}, {"a": a, "b": b})
    values = {"x": np.random.default_rng(4).normal(size=(4, 6)).astype(np.float32)}
    assert_same_bits(graph, values)
    assert kinds(graph).count("rows") + kinds(graph).count("columns") == 2


def test_a_transformer_block_keeps_its_bits():
    """Layernorm, attention with softmax, a residual stream read by many kernels, gelu."""
    def block(e, x, wq, wo):
        h = x
        for _ in range(3):
            normed = e("layernorm", h, eps=1e-5)
            q = e("matmul", normed, wq)
            scores = e("softmax", e("matmul", q, e("transpose", normed, perm=(0, 2, 1))), axis=-1)
            attended = e("matmul", scores, normed)
            h = e("add", h, e("gelu", e("matmul", attended, wo)))
        return h

    graph, values = differentiated(block, {"x": (2, 5, 8), "wq": (8, 8), "wo": (8, 8)})
    assert_same_bits(graph, values)


def test_no_elementwise_kernel_writes_a_buffer_that_no_step_reads():
    """gelu's gradient in char-lm's transformer blocks: the planner writes the product
    g * x / 2 out for its three kernel readers, then its one reader merges into the same
    kernel, which recomputes it; the store left with no reader is dropped (such stores were
    1.2 GB a step of gpt-50m)."""
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    experiment = load_experiment(str(Path(__file__).resolve().parents[2] / "examples" / "char-lm.sexp"))
    lowered = FUSED.lowered(build_run(experiment, "cpu").program.training.micro)
    read = {key for step in lowered.launches for key in step.reads}
    unread = [(key, lowered.buffers[key].shape) for step in lowered.launches if step.kind == "elementwise"
              for key in step.writes if key not in read and lowered.buffers[key].kind == "arena"]
    assert not unread, unread


def gelu_block(e, x, weight, b):
    product = e("matmul", x, weight)
    return e("gelu", e("add", product, e("broadcast", b, shape=product.shape)))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_bias_gradient_computes_gelus_gradient_where_it_sums_it(dtype):
    """gelu(x W + b): the column kernel that sums the gradient at gelu's input over the rows
    for db computes it from gelu's operands and stores it for the products, rather than
    read it back from an elementwise kernel that wrote it."""
    graph, values = differentiated(gelu_block, {"x": (96, 8), "weight": (8, 40), "b": (40,)}, dtype)
    assert_same_bits(graph, values)
    lowered = FUSED.lowered(graph)
    summing, = [step for step in lowered.launches if step.kind == "columns" and lowered.outputs["db"] in step.writes]
    assert "m_exp" in summing.kernel.first.source and len(summing.writes) == 2
    assert kinds(graph) == ["matmul", "elementwise", "rows", "columns", "matmul", "matmul"]
    rule = "an elementwise kernel's value joins the column kernel after it that reads it"
    assert any(str(decision).endswith(rule) for decision in lowered.decisions)


def test_a_value_only_its_column_kernel_reads_is_not_stored():
    """gelu(float32(bf16(x) bf16(W)) + b): the gradient at gelu's input is summed in float32
    for db and read by the products as its bf16 cast: the column kernel computes the float32
    value and stores only the cast."""
    def block(e, x, weight, b):
        bf16 = [e("cast", operand, dtype="bf16") for operand in (x, weight)]
        product = e("cast", e("matmul", *bf16), dtype="f32")
        return e("gelu", e("add", product, e("broadcast", b, shape=product.shape)))

    graph, values = differentiated(block, {"x": (96, 8), "weight": (8, 40), "b": (40,)}, "f32")
    assert_same_bits(graph, values)
    lowered = FUSED.lowered(graph)
    summing, = [step for step in lowered.launches if step.kind == "columns" and lowered.outputs["db"] in step.writes]
    stored = [lowered.buffers[key].dtype for key in summing.writes]
    assert "m_exp" in summing.kernel.first.source and stored == ["f32", "bf16"], stored
    assert any(str(decision).endswith("a store no kernel reads is dropped") for decision in lowered.decisions)


def test_adamw_updates_parameters_and_moments_in_one_kernel():
    """char-lm's AdamW: the parameter update reads the new moments and the step's bias
    corrections, which a small kernel computes between the moments' kernel and it. That
    kernel runs first, and the update joins the moments' kernel, recomputing the new moments
    rather than reading them back (two of nine passes over the flat float32 state a step)."""
    from sexpgpu.backends.cuda.fusion import PAST_RULE
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    experiment = load_experiment(str(Path(__file__).resolve().parents[2] / "examples" / "char-lm.sexp"))
    graph = build_run(experiment, "cpu").program.training.update
    rng = np.random.default_rng(9)
    values = {name: random_array(rng, node.dtype, node.shape, "normal") for name, node in graph.inputs.items()}
    values.update({name: np.abs(value) for name, value in values.items() if name.startswith("state/v/")})
    values.update(step=np.int32(3), lr=np.float32(0.01))
    assert_same_bits(graph, values)
    lowered = FUSED.lowered(graph)
    assert any(str(decision).endswith(PAST_RULE) for decision in lowered.decisions)
    flat = max(buffer.shape for buffer in lowered.buffers.values() if len(buffer.shape) == 1)
    flat_writes = [sum(lowered.buffers[key].shape == flat for key in step.writes) for step in lowered.launches
                   if step.kind == "elementwise"]
    assert max(flat_writes) == 3 and flat_writes.count(2) == 0, flat_writes  # parameters, m and v together


def test_a_store_joins_past_no_kernel_that_reads_what_the_kernel_before_writes():
    """y = 2x is written; s = sum(y) reads it; z = y + s cannot join y's kernel past s."""
    e = Emitter()
    x = e.input("x", "f32", (64,))
    y = e("mul", x, e.const(2.0))
    total = e("sum", y, axes=None)
    z = e("add", y, e("broadcast", total, shape=(64,)))
    graph = e.graph({"x": x}, {"y": y, "z": z})
    assert_same_bits(graph, {"x": np.random.default_rng(8).normal(size=(64,)).astype(np.float32)})
    from sexpgpu.backends.cuda.fusion import PAST_RULE

    assert not any(str(decision).endswith(PAST_RULE) for decision in FUSED.lowered(graph).decisions)


# --- the recompute rule ---------------------------------------------------------------------


def test_the_residual_stream_is_written_out_not_re_added_by_every_reader():
    """h_k = h_{k-1} + b_k, each read by two reductions: recomputed, every reader of h_k
    would read all k + 1 buffers; the planner writes h_k out once it loads too much."""
    e = Emitter()
    inputs = {name: e.input(name, "f32", (4, 16)) for name in ["h0"] + [f"b{index}" for index in range(6)]}
    h, outputs = inputs["h0"], {}
    for index in range(6):
        h = e("add", h, inputs[f"b{index}"])
        outputs[f"s{index}"] = e("sum", h, axes=(1,))
        outputs[f"m{index}"] = e("max", h, axes=(1,))
    graph = e.graph(inputs, outputs)
    rng = np.random.default_rng(6)
    values = {name: rng.normal(size=(4, 16)).astype(np.float32) for name in inputs}
    assert_same_bits(graph, values)
    lowered = FUSED.lowered(graph)
    written = [key for key, buffer in lowered.buffers.items() if buffer.kind == "arena" and buffer.shape == (4, 16)]
    assert len(written) == 4  # h_2 ... h_5; h_1 (three readers) and h_6 (two) are recomputed
    # rows of 16 are one chunk: every reduction and every write-out is one row kernel
    assert [step.kind for step in lowered.launches] == ["rows"]


def test_kernel_readers_count_through_inlined_elementwise_readers():
    """x is read by one elementwise node that three reductions read: three kernels."""
    e = Emitter()
    x = e.input("x", "f32", (4, 6))
    y = e("exp", x)
    outputs = {"a": e("sum", y, axes=(1,)), "b": e("max", y, axes=(1,)), "c": e("sum", y, axes=(0,))}
    graph = e.graph({"x": x}, outputs)
    readers = KernelReaders(graph, lambda node: node.op == "exp")
    assert readers.count(y) == 3
    assert readers.count(x) == 3  # through y, which three kernels recompute
    assert readers.count(x, lambda reader: True) == 1  # unless y is written out


def test_the_byte_rule():
    size = 32 * 2048
    item = lambda key: 4  # noqa: E731
    bias = load("b", broadcast_view((2048,), (32, 2048)))
    two = load("a", contiguous((32, 2048))) + load("c", contiguous((32, 2048)))
    assert loaded_bytes(bias, size, item) == pytest.approx(4 / 32)
    assert loaded_bytes(two + bias, size, item) == pytest.approx(8 + 4 / 32)
    policy = FusionPolicy()
    rules = [recompute_rule(policy, two, 3, 4, 8.0),  # 3 x 8 <= 8 + 4 + 3 x 4
             recompute_rule(policy, two, 4, 4, 8.0),  # 32 > 8 + 4 + 16
             recompute_rule(policy, two, 1, 4, 100.0),  # one reader always inlines
             recompute_rule(FusionPolicy("off"), two, 1, 4, 8.0),
             recompute_rule(FusionPolicy(budget=0.1), two, 3, 4, 8.0)]  # 1 flop > 0.1 x 4
    assert rules == ["recomputing loads no more bytes than reading back", "reading back loads fewer bytes",
                     "one kernel reads it", "fusion is off", "over the recompute budget"]
    assert [STORE_RULES[rule] for rule in rules] == [True, False, True, False, False]
