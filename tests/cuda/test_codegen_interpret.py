"""The generated kernels' logic, checked on the CPU with Triton's interpreter.

Each kernel is generated exactly as on the GPU and run on small shapes by
TRITON_INTERPRET=1; the results are compared with float64 numpy. What the interpreter
cannot show is the GPU's own reduction tree and libdevice math: tests/cuda/test_cuda_gpu.py does.
"""

from __future__ import annotations

from dataclasses import replace

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs tests/cuda/test_cuda_gpu.py instead
    pytest.skip("a GPU is present: the GPU tests check these kernels there", allow_module_level=True)
pytest.importorskip("triton")


from sexpgpu.backends.cuda.codegen import expr as E  # noqa: E402
from sexpgpu.backends.cuda.codegen import recipes  # noqa: E402
from sexpgpu.backends.cuda.codegen.columns import ColumnKernel, ColumnSpec  # noqa: E402
from sexpgpu.backends.cuda.codegen.flat import FlatSpec, flat_kernel  # noqa: E402
from sexpgpu.backends.cuda.codegen.rows import Phase, Reduction, RowKernel, RowSpec  # noqa: E402
from sexpgpu.backends.cuda.codegen.space import View, broadcast_view, contiguous, unit_view  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py



RNG = np.random.default_rng(20261129)


def tensor(shape, scale=1.0, dtype=np.float32):
    return torch.from_numpy((RNG.standard_normal(shape) * scale).astype(dtype))


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


# --- elementwise -------------------------------------------------------------------------------


def test_flat_kernel_broadcasts_and_fuses_a_chain():
    a, b = tensor((6, 7)), tensor((7,))
    x, y = E.load(0, contiguous((6, 7))), E.load(1, broadcast_view((7,), (6, 7)))
    value = E.unary("exp", x * y) / (E.unary("abs", x) + 1.0) - E.binary("max", x, y)
    out = torch.empty(6, 7)
    flat_kernel(FlatSpec((6, 7), ("f32", "f32"), ((contiguous((6, 7)), "f32", value),)))(a, b, out)
    a64, b64 = a.double().numpy(), b.double().numpy()
    close(out, np.exp(a64 * b64) / (np.abs(a64) + 1) - np.maximum(a64, b64), rtol=1e-5)


def test_flat_kernel_writes_several_outputs_through_transposed_views():
    a = tensor((4, 5))
    x = E.load(0, View((5, 4), (1, 5)))  # a.T as the kernel's space
    doubled, squared = torch.empty(5, 4), torch.empty(4, 5)
    spec = FlatSpec((5, 4), ("f32",), ((contiguous((5, 4)), "f32", x * 2.0), (View((5, 4), (1, 5)), "f32", x * x)))
    flat_kernel(spec)(a, doubled, squared)
    assert torch.equal(doubled, a.T * 2)
    assert torch.equal(squared, a * a)


def test_a_matrix_read_across_its_rows_is_walked_in_tiles_with_the_flat_walks_bits():
    # a weight cast to bf16 into its transpose, plus a broadcast column vector, a row index
    # and a scalar: tiles of TILE_ROWS x TILE_COLUMNS that the shape does not fill
    weight, bias, scale = tensor((70, 37)), tensor((70,)), tensor((1,))
    x = E.load(0, View((37, 70), (1, 37)))
    b = E.load(1, View((37, 70), (0, 1)))
    s = E.load(2, View((37, 70), (0, 0)))
    row = E.cast(E.iota(unit_view((37, 70), 0)), "f32")
    value = (x * s + b) * row
    outputs = ((contiguous((37, 70)), "bf16", E.cast(value, "bf16")), (View((37, 70), (1, 37)), "f32", x + 1.0))
    tiled = flat_kernel(FlatSpec((37, 70), ("f32", "f32", "f32"), outputs))
    assert len(tiled.grid) == 2 and "rr" in tiled.source
    cast, again = torch.empty(37, 70, dtype=torch.bfloat16), torch.empty(70, 37)
    tiled(weight, bias, scale, cast, again)
    rows = torch.arange(37, dtype=torch.float32)[:, None]
    want = ((weight.T * scale + bias) * rows).to(torch.bfloat16)
    assert torch.equal(cast.view(torch.int16), want.view(torch.int16))
    assert torch.equal(again, weight + 1.0)
    # the same values read in row order stay a flat walk
    flat = flat_kernel(FlatSpec((37, 70), ("f32",), ((contiguous((37, 70)), "f32", E.load(0, contiguous((37, 70))) + 1.0),)))
    assert len(flat.grid) == 1 and "rr" not in flat.source


def test_a_view_through_a_reshape_keeps_its_own_axes():
    # a (2, 3, 4) tensor's bias of length 4, read by a kernel whose space is (24,)
    bias = tensor((4,))
    value = E.load(0, View((2, 3, 4), (0, 0, 1)))
    out = torch.empty(24)
    flat_kernel(FlatSpec((24,), ("f32",), ((contiguous((24,)), "f32", value),)))(bias, out)
    assert torch.equal(out, bias.repeat(6))


def test_round_to_bf16_is_nearest_even_like_torch():
    bits = RNG.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[np.isfinite(values)]
    ties = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8), 3.3895314e38], dtype=np.float32)
    data = torch.from_numpy(np.concatenate([values, ties]))
    out_f32, out_bf16 = torch.empty_like(data), torch.empty(data.shape, dtype=torch.bfloat16)
    x = E.load(0, contiguous(data.shape))
    spec = FlatSpec(tuple(data.shape), ("f32",), ((contiguous(data.shape), "f32", E.cast(x, "bf16")),
                                                 (contiguous(data.shape), "bf16", x)))
    flat_kernel(spec)(data, out_f32, out_bf16)
    want = data.to(torch.bfloat16)
    assert torch.equal(out_bf16.view(torch.int16), want.view(torch.int16))
    assert torch.equal(out_f32, want.float())


def test_bf16_operands_load_as_float32():
    data = tensor((33,)).to(torch.bfloat16)
    out = torch.empty(33)
    x = E.load(0, contiguous((33,)))
    flat_kernel(FlatSpec((33,), ("bf16",), ((contiguous((33,)), "f32", x + 0.0),)))(data, out)
    assert torch.equal(out, data.float())


def test_iota_gives_a_causal_mask_and_a_one_hot():
    mask = torch.empty(5, 5, dtype=torch.bool)
    below = E.binary("le", E.iota(unit_view((5, 5), 1)), E.iota(unit_view((5, 5), 0)))
    flat_kernel(FlatSpec((5, 5), (), ((contiguous((5, 5)), "bool", below),)))(mask)
    assert torch.equal(mask, torch.tril(torch.ones(5, 5, dtype=torch.bool)))
    ids = torch.tensor([2, 0, 3], dtype=torch.int32)
    hot = E.cast(E.binary("eq", E.load(0, View((3, 4), (1, 0)), "i32"), E.iota(unit_view((3, 4), 1))), "f32")
    out = torch.empty(3, 4)
    flat_kernel(FlatSpec((3, 4), ("i32",), ((contiguous((3, 4)), "f32", hot),)))(ids, out)
    assert torch.equal(out, torch.nn.functional.one_hot(ids.long(), 4).float())


def test_scalars_are_read_from_device_tensors():
    p, g, lr = tensor((9,)), tensor((9,)), torch.tensor(0.25)
    value = E.load(0, contiguous((9,))) - E.scalar(2) * E.load(1, contiguous((9,)))
    out = torch.empty(9)
    flat_kernel(FlatSpec((9,), ("f32", "f32", "f32"), ((contiguous((9,)), "f32", value),)))(p, g, lr, out)
    assert torch.equal(out, p - 0.25 * g)


# --- rows ----------------------------------------------------------------------------------------


def _row_kernel(shape, phases, outputs, row_stores=(), inputs=("f32",), reduced_rank=1):
    return RowKernel(RowSpec(tuple(shape), reduced_rank, tuple(inputs), tuple(outputs), tuple(phases), tuple(row_stores)))


@pytest.fixture
def small_blocks(monkeypatch):
    """Chunks and splits at small sizes, so that the interpreter walks several of them
    quickly: the generated loops depend on these sizes only through their values."""
    from sexpgpu.backends.cuda.codegen import columns, rows

    monkeypatch.setattr(rows, "MAX_BLOCK", 32)
    monkeypatch.setattr(rows, "SPLIT_CHUNK", 64)
    monkeypatch.setattr(rows, "SPLIT_MIN_LENGTH", 200)
    monkeypatch.setattr(columns, "COLUMN_TILES", tuple(replace(tile, chunk_tiles=1) for tile in columns.COLUMN_TILES))


@pytest.mark.parametrize("length", [20, 70])  # one chunk, and three chunks of 32
def test_softmax_and_log_softmax(length, small_blocks):
    a = tensor((2, length), scale=4.0)
    x = E.load(0, contiguous(a.shape))
    out = torch.empty_like(a)
    _row_kernel(a.shape, recipes.softmax(x, 0), [(contiguous(a.shape), "f32")])(a, out)
    a64 = a.double().numpy()
    shifted = a64 - a64.max(-1, keepdims=True)
    close(out, np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True), rtol=2e-5, atol=1e-9)
    _row_kernel(a.shape, recipes.log_softmax(x, 0), [(contiguous(a.shape), "f32")])(a, out)
    close(out, shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)), rtol=2e-5, atol=2e-5)


def test_softmax_over_a_middle_axis_reads_through_strides():
    a = tensor((2, 6, 3))
    view = View((2, 3, 6), (18, 1, 3))  # axis 1 moved last
    out = torch.empty_like(a)
    _row_kernel((2, 3, 6), recipes.softmax(E.load(0, view), 0), [(view, "f32")])(a, out)
    close(out, torch.softmax(a.double(), dim=1).numpy(), rtol=2e-5, atol=1e-9)


def test_layernorm_and_its_row_statistics():
    a = tensor((4, 70), scale=3.0) + 5.0
    out = torch.empty_like(a)
    _row_kernel(a.shape, recipes.layernorm(E.load(0, contiguous(a.shape)), 70, 1e-5, 0), [(contiguous(a.shape), "f32")])(a, out)
    a64 = a.double().numpy()
    centered = a64 - a64.mean(-1, keepdims=True)
    close(out, centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5), rtol=1e-4, atol=1e-5)


def test_cross_entropy_per_row():
    logits, labels = tensor((5, 11), scale=3.0), torch.tensor([0, 10, 3, 3, 7], dtype=torch.int32)
    x = E.load(0, contiguous((5, 11)))
    label = E.load(1, View((5, 11), (1, 0)), "i32")
    phases, value = recipes.cross_entropy(x, label, E.iota(unit_view((5, 11), 1)))
    out = torch.empty(5)
    _row_kernel((5, 11), phases, [(View((5, 11), (1, 0)), "f32")], [(0, value)], ("f32", "i32"))(logits, labels, out)
    want = torch.nn.functional.cross_entropy(logits.double(), labels.long(), reduction="none")
    close(out, want.numpy(), rtol=1e-5, atol=1e-6)


def test_argmax_takes_the_first_of_equal_maxima():
    a = torch.tensor([[1.0, 3.0, 3.0, 0.0], [-1.0, -1.0, -2.0, -1.0], [0.0, float("nan"), 5.0, float("nan")]])
    phases, value = recipes.argmax(E.load(0, contiguous((3, 4))), E.iota(unit_view((3, 4), 1)), 4)
    out = torch.empty(3, dtype=torch.int32)
    _row_kernel((3, 4), phases, [(View((3, 4), (1, 0)), "i32")], [(0, value)])(a, out)
    assert out.tolist() == np.argmax(a.numpy(), axis=1).tolist() == [1, 0, 1]


def test_sum_over_two_trailing_axes():
    a = tensor((3, 4, 5))
    out = torch.empty(3)
    phase = Phase((Reduction("sum", E.load(0, contiguous(a.shape))),))
    _row_kernel(a.shape, [phase], [(View((3, 4, 5), (1, 0, 0)), "f32")], [(0, E.row(0))], reduced_rank=2)(a, out)
    close(out, a.double().sum((1, 2)).numpy(), rtol=1e-5, atol=1e-5)


def test_long_rows_split_into_partials_then_reduce_them(small_blocks):
    a = tensor((2, 300))
    out = torch.empty(2)
    phase = Phase((Reduction("sum", E.load(0, contiguous(a.shape)) * E.load(0, contiguous(a.shape))),))
    kernel = _row_kernel(a.shape, [phase], [(View(a.shape, (1, 0)), "f32")], [(0, E.unary("sqrt", E.row(0)))])
    assert kernel.parts == 5  # 300 elements in chunks of 64
    kernel(a, out)
    want = [math.sqrt(math.fsum(float(v) ** 2 for v in row)) for row in a.numpy()]
    close(out, want, rtol=1e-5)


def test_a_row_gives_the_same_bits_whatever_the_other_rows():
    """The tree depends on the row length alone: a row's result does not move with the
    number of rows or with what the other rows hold."""
    base = tensor((1, 300))
    phase = Phase((Reduction("sum", E.load(0, contiguous((1, 300)))),))
    single = torch.empty(1)
    _row_kernel((1, 300), [phase], [(View((1, 300), (1, 0)), "f32")], [(0, E.row(0))])(base, single)
    many = torch.cat([tensor((3, 300)), base, tensor((2, 300))])
    phase = Phase((Reduction("sum", E.load(0, contiguous((6, 300)))),))
    out = torch.empty(6)
    _row_kernel((6, 300), [phase], [(View((6, 300), (1, 0)), "f32")], [(0, E.row(0))])(many, out)
    assert out[3].view(torch.int32) == single[0].view(torch.int32)


# --- columns -------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [10, 300])  # one chunk, and partial sums of several chunks
def test_column_sums_and_maxima(rows, small_blocks):
    a = tensor((rows, 5))
    x = E.load(0, contiguous(a.shape))
    spec = ColumnSpec((rows,), (5,), ("f32",), (Reduction("sum", x * x), Reduction("max", x)),
                      ((contiguous((5,)), "f32"), (contiguous((5,)), "f32")), ((0, E.row(0) / float(rows)), (1, E.row(1))))
    mean_square, top = torch.empty(5), torch.empty(5)
    ColumnKernel(spec)(a, mean_square, top)
    close(mean_square, (a.double() ** 2).mean(0).numpy(), rtol=1e-5)
    assert torch.equal(top, a.max(0).values)


def test_column_sum_over_leading_axes_of_a_broadcast_operand():
    # the gradient of a bias broadcast over (batch, time): sum over both leading axes
    g = tensor((3, 4, 6))
    x = E.load(0, contiguous(g.shape))
    spec = ColumnSpec((3, 4), (6,), ("f32",), (Reduction("sum", x),), ((contiguous((6,)), "bf16"),), ((0, E.row(0)),))
    out = torch.empty(6, dtype=torch.bfloat16)
    ColumnKernel(spec)(g, out)
    close(out.float(), g.double().sum((0, 1)).to(torch.bfloat16).double().numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_a_sum_over_fewer_rows_than_a_tile_takes_only_the_lanes_it_fills(rows, monkeypatch):
    """A sum over a batch of 8 takes 8 lanes, not a whole tile's: the same bits as the full
    tile's tree, whose extra lanes add +0, with columns of -0, of cancelling values, of
    infinities and NaN among them."""
    from sexpgpu.backends.cuda.codegen import columns

    a = tensor((rows, 40), scale=3.0)
    a[:, 0] = -0.0
    a[:, 1] = float("inf")
    a[0, 2] = float("nan")
    if rows > 1:
        a[1, 3] = -a[0, 3]
    x = E.load(0, contiguous(a.shape))
    spec = ColumnSpec((rows,), (40,), ("f32",), (Reduction("sum", x), Reduction("max", x)),
                      ((contiguous((40,)), "f32"), (contiguous((40,)), "f32")), ((0, E.row(0)), (1, E.row(1))))
    kernel = ColumnKernel(spec)
    assert kernel.first.source.count(f"tl.arange(0, {max(2, 1 << (rows - 1).bit_length())})") == 1
    filled = (torch.empty(40), torch.empty(40))
    kernel(a, *filled)
    whole_tile = columns.tile_for
    monkeypatch.setattr(columns, "tile_for", lambda kept, reduced: whole_tile(kept, 1 << 20))
    full = (torch.empty(40), torch.empty(40))
    ColumnKernel(spec)(a, *full)
    for got, want in zip(filled, full):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    close(filled[0][4:], a.double().sum(0).numpy()[4:], rtol=1e-5)


# --- scatter -------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [3, 200, 1500])  # one program a row of 16, 256 and twice 1024 columns
def test_scatter_add_folds_each_table_row_in_the_interpreters_order(width):
    """An embedding's gradient: each table row is the fold from +0, in increasing position,
    of the rows whose id names it, which is np.add.at's order; rows no id names are +0."""
    from sexpgpu.backends.cuda.codegen.scatter import scatter_add

    rng = np.random.default_rng(width)
    ids = torch.from_numpy(rng.integers(0, 7, size=(3, 5)).astype(np.int32))
    values = torch.from_numpy((rng.standard_normal((15, width)) * 10.0 ** rng.integers(-3, 4, (15, 1)))
                              .astype(np.float32))
    out = torch.empty((9, width))
    scatter_add(ids, values, out)
    want = np.zeros((9, width), np.float32)
    np.add.at(want, ids.numpy().reshape(-1), values.numpy())
    assert np.array_equal(out.numpy().view(np.uint32), want.view(np.uint32))
