"""The interpreter's fast paths give the bits of their plain definitions.

Oracles: Python loops over numpy float32 scalars for folds and products (one rounded
multiply, then one rounded add, term by term), and plain sexpgpu.numerics calls for the
memo, the look-ahead pow and the masked exp. Data are chosen so that other summation
orders or starts give other bits.
"""

from __future__ import annotations

import numpy as np
import pytest

from sexpgpu import numerics as nx
from sexpgpu.backends.cpu import Interpreter, folds, native, op_kernels
from sexpgpu.backends.cpu.arith import PortableF32
from sexpgpu.graph.core.emit import Emitter


def _ill_conditioned(shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-10, 10, shape))).astype(np.float32)


def _fold_oracle(rows: np.ndarray) -> np.ndarray:
    """rows[0] + rows[1] + ..., one float32 addition at a time, element by element."""
    flat = rows.reshape(rows.shape[0], -1)
    out = np.empty(flat.shape[1], np.float32)
    for column in range(flat.shape[1]):
        acc = flat[0, column]
        for value in flat[1:, column]:
            acc = np.float32(acc + value)
        out[column] = acc
    return out.reshape(rows.shape[1:])


def _matmul_oracle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    big_a = np.broadcast_to(a, batch + a.shape[-2:])
    big_b = np.broadcast_to(b, batch + b.shape[-2:])
    acc = big_a[..., :, 0, None] * big_b[..., None, 0, :]
    for k in range(1, a.shape[-1]):
        acc = (acc + big_a[..., :, k, None] * big_b[..., None, k, :]).astype(np.float32)
    return acc


def _same_bits(x, y) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    return x.shape == y.shape and x.tobytes() == y.tobytes()


# --- the leading-axis reduce -------------------------------------------------------------------


def test_numpy_reduces_a_leading_axis_as_the_left_fold():
    assert folds.LEADING_REDUCE_FOLDS, "this numpy reduces leading axes in another order: the folds fall back to loops"


@pytest.mark.parametrize("shape", [(1, 5), (2, 2), (3, 4), (64, 3), (300, 2), (1000, 7), (17, 5, 6), (9, 4096)])
def test_fold_into_is_the_left_fold(shape):
    rows = _ill_conditioned(shape, seed=len(shape) + shape[0])
    out = np.empty(shape[1:], np.float32)
    folds.fold_into(rows, out)
    assert _same_bits(out, _fold_oracle(rows))
    assert _same_bits(folds.fold_rows(rows), _fold_oracle(rows))


def test_fold_keeps_signed_zeros_nan_and_inf_as_the_fold_does():
    rows = np.array([[-0.0, -0.0, 0.0, np.inf, 1.0, -0.0],
                     [-0.0, 0.0, -0.0, -np.inf, np.nan, 3.0],
                     [-0.0, -0.0, -0.0, 1.0, 2.0, -3.0]], np.float32)
    out = np.empty(6, np.float32)
    with np.errstate(invalid="ignore"):
        folds.fold_into(rows, out)
        assert _same_bits(out, _fold_oracle(rows))
    assert np.signbit(out[0]) and not np.signbit(out[1]) and not np.signbit(out[5])


def test_a_single_output_folds_in_order_too():
    column = _ill_conditioned((5000, 1), seed=9)
    out = np.empty((1,), np.float32)
    folds.fold_into(column, out)
    assert _same_bits(out, _fold_oracle(column))
    assert out[0] != np.float32(np.sum(column, dtype=np.float32)), "pick a case where pairwise summation differs"


def test_without_the_leading_reduce_the_loops_give_the_same_bits(monkeypatch):
    a, b = _ill_conditioned((3, 40, 33), 1), _ill_conditioned((33, 70), 2)
    rows = _ill_conditioned((50, 6), 3)
    fast = folds.matmul(a, b), folds.fold_rows(rows)
    monkeypatch.setattr(folds, "LEADING_REDUCE_FOLDS", False)
    slow = folds.matmul(a, b), folds.fold_rows(rows)
    assert all(_same_bits(x, y) for x, y in zip(fast, slow))


# --- products ---------------------------------------------------------------------------------------

PRODUCT_SHAPES = [
    ((1, 7), (7, 1)),  # one output element
    ((5, 3), (3, 9)), ((9, 3), (3, 5)),  # small, both layouts
    ((2, 70, 20), (20, 300)),  # a weight for a batch: rows merged; long rows
    ((300, 40), (40, 6)),  # laid out transposed
    ((3, 20, 40), (3, 40, 10)), ((20, 40), (3, 40, 10)), ((2, 1, 8, 5), (3, 5, 12)),  # batches broadcast
    ((4, 3, 16, 64), (4, 3, 64, 16)),  # attention-like
    ((8, 600), (600, 16)),  # long k
    ((6, 1), (1, 40)), ((7, 2), (2, 40)), ((5, 3), (3, 33)), ((9, 4), (4, 45)),  # k in pairs, one left over or none
]


@pytest.mark.parametrize("a_shape, b_shape", PRODUCT_SHAPES)
def test_matmul_is_the_fold_over_k(a_shape, b_shape):
    a, b = _ill_conditioned(a_shape, 4), _ill_conditioned(b_shape, 5)
    assert _same_bits(folds.matmul(a, b), _matmul_oracle(a, b))


def test_products_keep_subnormals_infinities_and_nan_as_the_fold_does():
    rng = np.random.default_rng(13)
    specials = np.array([0.0, -0.0, 1e-45, -3e-39, 1e-38, np.inf, -np.inf, np.nan, 3e38, -1.0], np.float32)
    for a_shape, b_shape in [((9, 40), (40, 70)), ((70, 40), (40, 5)), ((2, 6, 12), (2, 12, 33)),
                             ((13, 40), (40, 150))]:
        a, b = _ill_conditioned(a_shape, 14), _ill_conditioned(b_shape, 15)
        a.reshape(-1)[rng.integers(0, a.size, a.size // 30)] = rng.choice(specials, a.size // 30)
        b.reshape(-1)[rng.integers(0, b.size, b.size // 30)] = rng.choice(specials, b.size // 30)
        with np.errstate(all="ignore"):
            expected = _matmul_oracle(a, b)
            expected[np.isnan(expected)] = np.float32(np.nan)  # 0x7FC00000, whatever the hardware's sign and payload
            assert _same_bits(folds.matmul(a, b), expected), (a_shape, b_shape)


def test_products_are_not_fused_into_multiply_adds():
    """acc + x * y with acc = -(1 + 2^-11) and x = y = 1 + 2^-12: the rounded product is
    1 + 2^-11 and the sum 0; a fused multiply-add would give 2^-24. Rows of four and single
    rows, columns enough for every vector width."""
    a = np.tile(np.array([[-(1 + 2.0**-11), 1 + 2.0**-12]], np.float32), (7, 1))
    b = np.tile(np.array([[1.0], [1 + 2.0**-12]], np.float32), (1, 67))
    assert not folds.matmul(a, b).any()
    assert not folds.matmul(b.T.copy(), a.T.copy()).any()


@pytest.mark.parametrize("width", [9, 83])
@pytest.mark.parametrize("kernel", ["fold_products", "fold_product_tiles"])
def test_row_splits_and_layouts_do_not_change_bits(monkeypatch, kernel, width):
    """Any split of the rows between calls of the kernel (the threads' pieces) and either
    layout of a product (its transpose folded when rows are short) give the same bits."""
    fold = getattr(native, kernel)
    a, b = _ill_conditioned((2, 11, 30), 16), _ill_conditioned((30, width), 17)
    left, right = a.copy(), b.reshape(1, 30, width).copy()
    whole = np.empty((2, 11, width), np.float32)
    fold(left, right, whole, 0, 22)
    for cuts in [(0, 1, 22), (0, 3, 5, 6, 13, 22), tuple(range(23))]:
        pieces = np.empty_like(whole)
        for first, stop in zip(cuts, cuts[1:]):
            fold(left, right, pieces, first, stop)
        assert _same_bits(pieces, whole), cuts
    assert _same_bits(whole, _matmul_oracle(a, b))
    for narrow in (0, 10**6):
        monkeypatch.setattr(folds, "NARROW", narrow)
        assert _same_bits(folds.matmul(a, b), whole)


@pytest.mark.parametrize("width", [1, 15, 16, 17, 64, 83, 150])
def test_product_tiles_read_a_strided_left_operand_in_place(width):
    """The register tiles (64 and 16 columns, rows of four or one, the columns left over one
    by one) on a left operand of any strides: transposed, reversed, broadcast."""
    x, b = _ill_conditioned((2, 19, 7), 26), _ill_conditioned((2, 19, width), 27)
    right = b.copy()
    for left in (x.swapaxes(1, 2), x.swapaxes(1, 2)[:, ::-1], np.broadcast_to(x[:1].swapaxes(1, 2), (2, 7, 19))):
        out = np.empty((2, 7, width), np.float32)
        native.fold_product_tiles(folds._read_only(left), folds._read_only(right), out, 0, 14)
        assert _same_bits(out, _matmul_oracle(np.ascontiguousarray(left), b))


def test_a_left_operand_whose_strides_split_elements_is_read_as_its_values():
    """Strides that are no multiple of 4 bytes (a view of a byte buffer): the kernels step by
    whole elements, so the product reads a copy. Each 4-byte window of bytes 0x3F and 0x40 is
    a finite float32 of its own."""
    buffer = np.random.default_rng(28).choice(np.array([0x3F, 0x40], np.uint8), 600)
    a = np.ndarray((6, 20), np.float32, buffer, offset=1, strides=(81, 4))
    b = _ill_conditioned((20, 70), 29)
    assert _same_bits(folds.matmul(a, b), _matmul_oracle(np.ascontiguousarray(a), b))


def test_products_of_negative_zero_fold_to_negative_zero():
    a = np.array([[-0.0, 0.0, 1.0], [0.0, -0.0, -1.0]], np.float32)
    b = np.array([[1.0, -1.0], [-1.0, 1.0], [0.0, -0.0]], np.float32)
    # out[0, 0] over the first two k: -0*1 = -0, then -0 + 0*-1 = -0 + -0 = -0 (a fold from +0 gives +0)
    assert _same_bits(folds.matmul(a, b), _matmul_oracle(a, b))
    assert _same_bits(folds.matmul(a[:, :2], b[:2]), _matmul_oracle(a[:, :2], b[:2]))
    assert np.signbit(folds.matmul(a[:1, :2], b[:2])[0, 0])


def test_a_product_over_no_terms_is_positive_zero():
    for a_shape, b_shape in [((2, 0), (0, 3)), ((4, 2, 0), (0, 5))]:
        result = folds.matmul(np.ones(a_shape, np.float32), np.ones(b_shape, np.float32))
        assert result.shape == a_shape[:-1] + b_shape[-1:] and not np.signbit(result).any() and not result.any()


def test_matmul_of_float64_operands_stays_float64():
    a, b = np.ones((3, 4)), np.ones((4, 2))
    result = folds.matmul(a, b)
    assert result.dtype == np.float64 and np.array_equal(result, np.full((3, 2), 4.0))


# --- the memo of portable functions -------------------------------------------------------------------


def test_memo_hits_give_the_functions_bits_read_only_and_shared():
    math = PortableF32()
    for shape in [(30, 7), (300, 20)]:  # the small memo and the large one
        x = _ill_conditioned(shape, 8) * np.float32(1e-9)
        first = math.exp(x)
        assert _same_bits(first, nx.exp(x))
        with pytest.raises(ValueError):
            first[0, 0] = 123.0  # shared with the memo, so no caller may write it (no kernel writes its inputs)
        again = math.exp(x.copy())
        assert _same_bits(again, nx.exp(x))
        assert again is first  # a hit costs no copy


def test_memo_tells_apart_inputs_that_differ_in_one_bit():
    math = PortableF32()
    for shape in [(40,), (300, 20)]:  # keyed by bytes, and compared in full
        x = np.linspace(-3, 3, int(np.prod(shape)), dtype=np.float32).reshape(shape)
        y = x.copy()
        y.reshape(-1)[-1] = np.nextafter(y.reshape(-1)[-1], np.float32(9))
        z = x.copy()
        z.reshape(-1)[len(z.reshape(-1)) // 2] = -0.0 if z.reshape(-1)[len(z.reshape(-1)) // 2] == 0 else 0.0
        for value in (x, y, z, x):
            assert _same_bits(math.tanh(value), nx.tanh(value))
    signed = np.array([0.0, -0.0], np.float32)
    assert _same_bits(math.rsqrt(signed), nx.rsqrt(signed))
    assert _same_bits(math.rsqrt(signed[::-1].copy()), nx.rsqrt(signed[::-1].copy()))


def test_pow_looks_ahead_over_whole_exponents_with_the_same_bits():
    math = PortableF32()
    bases = np.array([0.9, 0.999], np.float32)
    for step in range(1, 150):
        exponent = np.float32(step)
        got = math.pow(bases, exponent)
        assert _same_bits(got, nx.pow(bases, np.full(2, exponent, np.float32))), step


def test_pow_of_other_exponents_is_the_plain_call():
    math = PortableF32()
    x = np.array([0.5, 2.0, 3.0], np.float32)
    for y in (np.float32(0.5), np.array([1.5, -2.0, np.inf], np.float32), np.float32(2.0**24)):
        assert _same_bits(math.pow(x, y), nx.pow(*np.broadcast_arrays(x, np.asarray(y, np.float32))))


def test_exp_of_masked_scores_is_exp_of_every_entry():
    math = PortableF32()
    scores = _ill_conditioned((4, 16, 16), 10) * np.float32(1e-9)
    scores = np.where(np.tril(np.ones((16, 16), bool)), scores, -np.inf).astype(np.float32)
    got = op_kernels._exp_of_shifted(scores, math)
    assert _same_bits(got, nx.exp(scores))
    assert _same_bits(op_kernels._exp_of_shifted(scores[..., :1], math), nx.exp(scores[..., :1]))


def test_remembered_attention_probabilities_are_the_computed_ones_per_scale_and_mask():
    """The backward kernels take the forward's probabilities from the memo when q and k have
    the same bits; a hit gives the computed bits, and another scale or mask is another entry."""
    from types import SimpleNamespace

    q, k = _ill_conditioned((2, 3, 40, 16), 18), _ill_conditioned((2, 3, 40, 16), 19)
    math = PortableF32()

    def node(scale, causal):
        return SimpleNamespace(attrs={"scale": scale, "causal": causal}, dtype="f32")

    for attrs in [(0.25, True), (0.25, False), (0.5, True), (0.25, True)]:
        got = op_kernels._attention_probabilities(node(*attrs), q.copy(), k.copy(), math)
        assert _same_bits(got, op_kernels._probabilities_of(node(*attrs), q, k, PortableF32())), attrs
    assert sum(key[0].startswith("attention_probabilities") for key in math.memo.small) == 3



def test_the_score_gradient_remembered_by_one_backward_kernel_serves_the_other_with_its_bits():
    from types import SimpleNamespace

    args = tuple(_ill_conditioned((2, 3, 40, 16), seed) for seed in range(20, 25))
    node = SimpleNamespace(attrs={"scale": 0.25, "causal": True}, dtype="f32")
    math = PortableF32()
    op_kernels._attention_grad_q(node, args, math)
    assert any(key[0].startswith("attention_score_grad") for key in math.memo.small)
    got = op_kernels._attention_grad_kv(node, tuple(a.copy() for a in args), math)
    assert _same_bits(got, op_kernels._attention_grad_kv(node, args, PortableF32()))


def _logits_with_specials(shape, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = _ill_conditioned(shape, seed) * np.float32(1e-30)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3.4028235e38], np.float32)
    x[0] = rng.choice(specials, shape[1:])  # rows of special values
    x[1] = rng.choice(np.array([0.0, -0.0], np.float32), shape[1:])
    x[2, :, ::2] = -np.inf
    return x


def test_cross_entropy_and_softmax_from_the_compiled_rows_give_the_numpy_steps_bits():
    """The cross-entropy from one compiled pass (its rows' maxima and sums), and the softmax of
    the same logits, which the memo hands over, against the numpy steps they replace."""
    from types import SimpleNamespace

    logits = _logits_with_specials((3, 5, 37), 30)
    labels = np.random.default_rng(31).integers(0, 37, (3, 5)).astype(np.int32)
    node = SimpleNamespace(attrs={"axis": 2}, loc=None)
    steps = PortableF32()
    steps.softmax_rows = None  # the numpy steps, as the f64 oracle runs them
    compiled = PortableF32()
    with np.errstate(all="ignore"):
        assert _same_bits(op_kernels._cross_entropy(node, (logits, labels), compiled),
                          op_kernels._cross_entropy(node, (logits, labels), steps))
        assert _same_bits(op_kernels._softmax(node, (logits.copy(),), compiled),
                          op_kernels._softmax(node, (logits,), steps))
        assert _same_bits(op_kernels._softmax(node, (logits[::-1].copy(),), compiled),
                          op_kernels._softmax(node, (logits[::-1],), steps))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ids_shape, row_shape", [((3, 7), (5,)), ((11,), (2, 3)), ((0,), (4,)), ((6,), ())])
def test_scatter_add_adds_rows_in_order_as_np_add_at_does(dtype, ids_shape, row_shape):
    from types import SimpleNamespace

    rng = np.random.default_rng(40)
    ids = rng.integers(0, 4, ids_shape).astype(np.int32)
    values = _ill_conditioned(ids_shape + row_shape, 41).astype(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45], dtype)
    values.reshape(-1)[:: 3] = rng.choice(specials, values.reshape(-1)[:: 3].size)
    expected = np.zeros((5,) + row_shape, dtype)
    with np.errstate(all="ignore"):
        np.add.at(expected, ids.reshape(-1).astype(np.intp), values.reshape((-1,) + row_shape))
        got = op_kernels._scatter_add(SimpleNamespace(attrs={"rows": 5}, loc=None), (ids, values), PortableF32())
    assert _same_bits(got, expected)

# --- compiled kernels and the interpreter's arrays --------------------------------------------------------


def test_constant_outputs_are_fresh_writable_arrays():
    e = Emitter()
    x = e.input("x", "f32", (3,))
    c = e.const(2.5, like=x, shape=(3,))
    graph = e.graph({"x": x}, {"c": c, "y": e("add", x, c)})
    interpreter = Interpreter()
    first = interpreter.run(graph, {"x": np.ones(3, np.float32)})
    first["c"][...] = 7  # the caller owns its outputs; the next run must not see this
    second = interpreter.run(graph, {"x": np.ones(3, np.float32)})
    assert second["c"].tolist() == [2.5] * 3 and second["y"].tolist() == [3.5] * 3
    assert second["c"].flags.writeable
