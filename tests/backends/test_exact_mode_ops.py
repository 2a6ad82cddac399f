"""Every op that sums, in the interpreter's exact arithmetic, against a Fraction oracle: each
sum exact and rounded once (backends/cpu/exact_kernels.py gives the rules).

The oracle sums in fractions.Fraction and rounds by tests/exact/exact_oracle.py's own IEEE
rules; elementwise steps (exp, log, rsqrt, a division by n) are the portable float32 math,
which tests/numerics checks against mpmath."""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.errors import SexpgpuError  # noqa: E402
from sexpgpu.exact import det_finalize  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402
from sexpgpu.graph.passes.exact_region import exact_graph, gradient_sums  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exact"))
from exact_oracle import round_fraction  # noqa: E402

EXACT = Interpreter()  # its exact rules run the graphs exact_graph makes
M = EXACT.math
F32 = np.float32


def _spread(rng, shape) -> np.ndarray:
    """Values over many binades and of both signs, so that float folds round differently."""
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-24, 24, shape)).astype(F32)


def _run(op, arrays, attrs, dtypes=None) -> np.ndarray:
    e = Emitter()
    nodes = [e.input(f"x{index}", (dtypes or {}).get(index, "f32"), array.shape) for index, array in enumerate(arrays)]
    y = e(op, *nodes, **attrs)
    graph = e.graph({f"x{index}": node for index, node in enumerate(nodes)}, {"y": y})
    return EXACT.run(exact_graph(graph), {f"x{index}": array for index, array in enumerate(arrays)})["y"]


def _once(terms) -> F32:
    """The exact sum of float32 terms (their products, given pairs), rounded once to float32."""
    return F32(round_fraction(sum((Fraction(float(term)) for term in terms), Fraction(0))))


def _dot(pairs) -> F32:
    return F32(round_fraction(sum((Fraction(float(a)) * Fraction(float(b)) for a, b in pairs), Fraction(0))))


def _same(found: np.ndarray, wanted: np.ndarray) -> None:
    wanted = np.asarray(wanted, F32)
    assert found.shape == wanted.shape
    assert np.array_equal(found.view(np.uint32), wanted.view(np.uint32)), (found, wanted)


def test_sum_over_any_axes_is_one_rounding_of_the_exact_sum():
    rng = np.random.default_rng(1)
    x = _spread(rng, (3, 4, 5))
    found = _run("sum", [x], {"axes": (0, 2), "keep": False})
    _same(found, [_once(x[:, j, :].ravel()) for j in range(4)])
    _same(_run("sum", [x], {"axes": None, "keep": True}), np.full((1, 1, 1), _once(x.ravel())))


def test_sum_where_every_float_fold_loses_the_small_terms():
    x = np.array([1.0, 2.0**-24, 2.0**-24, -1.0, 2.0**-30], F32)
    _same(_run("sum", [x], {"axes": (0,), "keep": False}), _once(x))
    assert _once(x) == F32(2.0**-23 + 2.0**-30)


def test_batched_matmul_broadcasts_and_rounds_each_output_once():
    rng = np.random.default_rng(2)
    a, b = _spread(rng, (2, 1, 3, 7)), _spread(rng, (3, 7, 4))
    found = _run("matmul", [a, b], {})
    wanted = np.empty((2, 3, 3, 4), F32)
    for i, j, m, n in itertools.product(range(2), range(3), range(3), range(4)):
        wanted[i, j, m, n] = _dot(zip(a[i, 0, m], b[j, :, n]))
    _same(found, wanted)
    flat_a = _spread(rng, (2, 5, 6))
    weight = _spread(rng, (6, 3))
    _same(_run("matmul", [flat_a, weight], {}),
          [[[_dot(zip(flat_a[i, m], weight[:, n])) for n in range(3)] for m in range(5)] for i in range(2)])


def _exact_softmax_parts(x: np.ndarray):
    """(shifted, exp(shifted), round(exact sum of the exps)) along the last axis."""
    shifted = x - x.max(-1, keepdims=True)
    exps = M.exp(shifted)
    totals = np.array([[_once(row)] for row in exps.reshape(-1, x.shape[-1])], F32).reshape(x.shape[:-1] + (1,))
    return shifted, exps, totals


def test_softmax_and_log_softmax_divide_by_the_rounded_exact_denominator():
    x = (np.random.default_rng(3).standard_normal((4, 9)) * 8).astype(F32)
    shifted, exps, totals = _exact_softmax_parts(x)
    _same(_run("softmax", [x], {"axis": 1}), exps / totals)
    _same(_run("log_softmax", [x], {"axis": 1}), shifted - M.log(totals))


def test_cross_entropy_is_minus_the_exact_log_softmax_of_the_label():
    rng = np.random.default_rng(4)
    logits, labels = (rng.standard_normal((2, 3, 5)) * 4).astype(F32), rng.integers(0, 5, (2, 3)).astype(np.int32)
    shifted, _, totals = _exact_softmax_parts(logits)
    wanted = -np.take_along_axis(shifted - M.log(totals), labels[..., None], -1)[..., 0]
    _same(_run("cross_entropy", [logits, labels], {}, {1: "i32"}), wanted)


def test_layernorm_statistics_are_rounded_exact_sums_divided_by_the_width():
    x = _spread(np.random.default_rng(5), (3, 6)) + F32(100)
    count = F32(6)
    mean = np.array([[_once(row) / count] for row in x], F32)
    centered = x - mean
    var = np.array([[_once(row * row) / count] for row in centered], F32)
    _same(_run("layernorm", [x], {"eps": 1e-5}), centered * M.rsqrt(var + F32(1e-5)))


def test_scatter_add_sums_each_rows_values_exactly():
    rng = np.random.default_rng(6)
    ids = np.array([[3, 0, 3], [3, 1, 0]], np.int32)
    values = _spread(rng, (2, 3, 4))
    found = _run("scatter_add", [ids, values], {"rows": 5}, {0: "i32"})
    wanted = np.zeros((5, 4), F32)
    for row in range(5):
        picked = values[ids == row]
        wanted[row] = [_once(picked[:, d]) for d in range(4)] if len(picked) else 0
    _same(found, wanted)


def _padded(x: np.ndarray, pad: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))


def test_conv2d_is_one_exact_sum_over_channels_and_window():
    rng = np.random.default_rng(7)
    x, w = _spread(rng, (2, 3, 5, 5)), _spread(rng, (4, 3, 3, 3))
    found = _run("conv2d", [x, w], {"stride": 2, "padding": 1})
    xp = _padded(x, 1)
    wanted = np.empty((2, 4, 3, 3), F32)
    for n, o, i, j in itertools.product(range(2), range(4), range(3), range(3)):
        wanted[n, o, i, j] = _dot(zip(xp[n, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].ravel(), w[o].ravel()))
    _same(found, wanted)


def test_conv2d_weight_grad_is_one_exact_sum_over_images_and_positions():
    rng = np.random.default_rng(8)
    x, g = _spread(rng, (2, 2, 4, 4)), _spread(rng, (2, 3, 4, 4))
    found = _run("conv2d_weight_grad", [x, g], {"stride": 1, "padding": 1, "weight_shape": (3, 2, 3, 3)})
    xp = _padded(x, 1)
    wanted = np.empty((3, 2, 3, 3), F32)
    for o, c, a, b in itertools.product(range(3), range(2), range(3), range(3)):
        wanted[o, c, a, b] = _dot(zip(g[:, o].ravel(), xp[:, c, a : a + 4, b : b + 4].ravel()))
    _same(found, wanted)


def test_conv2d_input_grad_is_one_exact_sum_over_every_window_reaching_an_element():
    rng = np.random.default_rng(9)
    g, w = _spread(rng, (1, 3, 3, 3)), _spread(rng, (3, 2, 3, 3))
    found = _run("conv2d_input_grad", [g, w], {"stride": 1, "padding": 1, "input_shape": (1, 2, 3, 3)})
    pairs = {}
    for o, y, x, c, a, b in itertools.product(range(3), range(3), range(3), range(2), range(3), range(3)):
        i, j = y + a - 1, x + b - 1
        if 0 <= i < 3 and 0 <= j < 3:
            pairs.setdefault((c, i, j), []).append((g[0, o, y, x], w[o, c, a, b]))
    wanted = np.empty((1, 2, 3, 3), F32)
    for (c, i, j), terms in pairs.items():
        wanted[0, c, i, j] = _dot(terms)
    _same(found, wanted)


def test_avg_pool2d_is_the_rounded_exact_window_sum_over_its_size():
    x = _spread(np.random.default_rng(10), (1, 2, 4, 4))
    found = _run("avg_pool2d", [x], {"kernel": 2, "stride": 1})
    wanted = np.empty((1, 2, 3, 3), F32)
    for c, i, j in itertools.product(range(2), range(3), range(3)):
        wanted[0, c, i, j] = _once(x[0, c, i : i + 2, j : j + 2].ravel()) / F32(4)
    _same(found, wanted)


def _overlapping_spread(shares_at, shape, kernel: int) -> np.ndarray:
    """Each element's exact sum of what the stride-1 windows reaching it give it."""
    terms = {}
    rows, cols = shape[2] - kernel + 1, shape[3] - kernel + 1
    for c, y, x, a, b in itertools.product(range(shape[1]), range(rows), range(cols), range(kernel), range(kernel)):
        terms.setdefault((c, y + a, x + b), []).append(shares_at(c, y, x, a, b))
    wanted = np.zeros(shape, F32)
    for (c, i, j), found in terms.items():
        wanted[0, c, i, j] = _once(found)
    return wanted


def test_avg_pool2d_grad_sums_overlapping_windows_exactly():
    g = _spread(np.random.default_rng(11), (1, 2, 3, 3))
    found = _run("avg_pool2d_grad", [g], {"kernel": 2, "stride": 1, "input_shape": (1, 2, 4, 4)})
    share = g / F32(4)
    _same(found, _overlapping_spread(lambda c, y, x, a, b: share[0, c, y, x], (1, 2, 4, 4), 2))


def test_max_pool2d_grad_sums_overlapping_windows_exactly():
    rng = np.random.default_rng(12)
    x, g = _spread(rng, (1, 2, 4, 4)), _spread(rng, (1, 2, 3, 3))
    found = _run("max_pool2d_grad", [x, g], {"kernel": 2, "stride": 1}, {})

    def share(c, y, x_, a, b):
        window = x[0, c, y : y + 2, x_ : x_ + 2].ravel()
        return g[0, c, y, x_] if int(np.argmax(window)) == a * 2 + b else F32(0)

    _same(found, _overlapping_spread(share, (1, 2, 4, 4), 2))


def test_a_gradient_region_returns_digits_rounded_once_at_the_end():
    """grad/w = transpose(matmul) + reshape(sum): one exact sum, not the sum of two roundings."""
    e = Emitter()
    a, b, c = e.input("a", "f32", (3, 2)), e.input("b", "f32", (3, 2)), e.input("c", "f32", (3, 4))
    product = e("transpose", e("matmul", e("transpose", a, perm=(1, 0)), b), perm=(1, 0))  # (2, 2)
    summed = e("reshape", e("sum", c, axes=(0,), keep=False), shape=(2, 2))
    graph = e.graph({"a": a, "b": b, "c": c}, {"grad/w": e("add", product, summed)})
    ones = np.ones((3, 2), F32)
    tiny = np.full((3, 4), F32(2.0**-25))
    tiny[0] = 1.0
    found = EXACT.run(exact_graph(graph), {"a": ones * F32(2.0**-25), "b": ones, "c": tiny})["grad/w"]
    # every output: 3 * 2**-25 from the product, 1 + 2 * 2**-25 from the sum
    wanted = F32(round_fraction(Fraction(1) + Fraction(5, 2**25)))
    assert wanted == F32(1 + 2.0**-23)
    _same(det_finalize(found).numpy(), np.full((2, 2), wanted))


def test_float32_attention_runs_as_its_exact_composition_and_bf16_attention_is_refused():
    rng = np.random.default_rng(13)
    q, k, v = (_spread(rng, (1, 2, 3, 4)) for _ in range(3))
    found = _run("attention_core", [q, k, v], {"scale": 0.5, "causal": True})
    scores = np.where(np.tril(np.ones((3, 3), bool)), _run("matmul", [q, np.swapaxes(k, -1, -2)], {}) * F32(0.5),
                      F32(-np.inf))
    _same(found, _run("matmul", [_run("softmax", [scores], {"axis": 3}), v], {}))
    bf16 = [np.asarray(array.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(F32) for array in (q, k, v)]
    with pytest.raises(SexpgpuError) as refused:
        _run("attention_core", bf16, {"scale": 0.5, "causal": True}, {0: "bf16", 1: "bf16", 2: "bf16"})
    assert refused.value.code == "E-EXACT-003"


def test_a_sum_too_long_for_one_call_is_cut_into_rows_with_the_same_rounding(monkeypatch):
    """det_sum (exact_ops.rounded_sum's) cuts a sum past the fast path's MAX_FAST_K terms into
    pieces of MAX_K_PER_CALL, here made small: the pieces' digits add to the one exact sum."""
    import torch

    from sexpgpu.backends import exact_ops
    from sexpgpu.exact import reduce

    monkeypatch.setattr(reduce, "MAX_FAST_K", 64)
    monkeypatch.setattr(reduce, "MAX_K_PER_CALL", 24)
    x = _spread(np.random.default_rng(14), (2, 100))
    found = exact_ops.rounded_sum(torch.from_numpy(x), (1,), (2,), "f32").numpy()
    _same(found, [_once(row) for row in x])


def test_exact_graph_says_what_is_exact_and_a_steps_sums_are_graphs_of_acc_values():
    """exact_graph: the gradient region's nodes are acc, other sums are marked exact, the rest
    is the float graph's; gradient_sums' graphs add two calls' acc values exactly, round once."""
    e = Emitter()
    x, g = e.input("x", "f32", (2, 1)), e.input("g", "f32", (2, 1))
    loss = e("sum", e("exp", x), axes=(0, 1))
    grad = e("matmul", e("transpose", x, perm=(1, 0)), g)
    graph = exact_graph(e.graph({"x": x, "g": g}, {"loss": loss, "grad/w": grad}))
    assert [(node.op, node.dtype, node.attrs.get("exact", False)) for node in graph.nodes[2:]] == [
        ("exp", "f32", False), ("sum", "f32", True), ("transpose", "f32", False), ("matmul", "acc", False)]
    sums = gradient_sums(e.graph({"grad/w": e.input("grad/w", "f32", (1, 1))}, {}))
    ones = np.ones((2, 1), F32)
    first = EXACT.run(graph, {"x": np.array([[1.0], [2.0**-24]], F32), "g": ones})["grad/w"]
    second = EXACT.run(graph, {"x": np.array([[2.0**-24], [0.0]], F32), "g": ones})["grad/w"]
    total = EXACT.run(sums.accumulate, {"total/grad/w": first, "grad/w": second})["grad/w"]
    # 1 + 2**-23 exactly; rounding each call's sum first would give 1 + 0 twice over
    _same(EXACT.run(sums.rounding, {"grad/w": total})["grad/w"], np.full((1, 1), F32(1 + 2.0**-23)))
