"""det_gemm's float64 stages hold their bounds: |exact - float64 result| <= bound for every output,
the exact sum taken from the Fraction oracle; on adversarial data, in several chunks of K, for
both stages; and each stage is reached by the data meant for it."""

import contextlib
from fractions import Fraction

import pytest
import torch

from adversarial import KINDS
from exact_oracle import BINARY32, oracle_gemm, same_bits
from exact_random import wide_random
from sexpgpu.exact import det_gemm
from sexpgpu.exact import bounded_gemm
from sexpgpu.exact.gemm import accumulate_planes
from sexpgpu.exact.rounding import round_planes
from sexpgpu.exact import float64_stage
from sexpgpu.exact.float64_stage import float64_product, gamma, upper_norms
from sexpgpu.exact.pair_sums import pair_sums

DTYPES = [torch.float32, torch.bfloat16]


def exact_sums(x, w):
    xs, ws = x.double().tolist(), w.double().tolist()
    return [[sum((Fraction(a) * Fraction(b) for a, b in zip(row, col)), Fraction(0)) for col in ws] for row in xs]


def assert_within(values, bounds, exact):
    for i, row in enumerate(exact):
        for j, true in enumerate(row):
            assert abs(Fraction(float(values[i][j])) - true) <= Fraction(float(bounds[i][j])), (i, j)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("chunk", [1, 7, 1024])
@pytest.mark.parametrize("split", [True, False], ids=["chunks side by side", "chunks in turn"])
def test_the_float64_product_is_within_its_bound(kind, dtype, chunk, split, monkeypatch):
    if not split:  # no output is small enough to take the chunks' products as one batch
        monkeypatch.setattr(float64_stage, "SPLIT_OUTPUTS", 0)
    generator = torch.Generator().manual_seed(len(kind) * 3 + chunk)
    x, w = KINDS[kind](5, 4, 60, dtype, generator)
    first = float64_product(x, w, chunk)
    assert_within(first.total.tolist(), first.bound().tolist(), exact_sums(x, w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_pair_sums_are_within_their_bound(kind, dtype):
    generator = torch.Generator().manual_seed(len(kind) + 11)
    x, w = KINDS[kind](4, 5, 77, dtype, generator)
    rows, cols = torch.tensor([0, 3, 1, 2, 0]), torch.tensor([4, 0, 2, 2, 1])
    result, bound = pair_sums(x, w, rows, cols, upper_norms(x.double()), upper_norms(w.double()))
    exact = exact_sums(x, w)
    for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        assert abs(Fraction(result[i].item()) - exact[r][c]) <= Fraction(bound[i].item())


def test_pair_sums_are_far_tighter_than_the_float64_product():
    generator = torch.Generator().manual_seed(4)
    x, w = torch.randn(3, 2000, generator=generator), torch.randn(3, 2000, generator=generator)
    first = float64_product(x, w)
    rows, cols = torch.tensor([0, 1, 2]), torch.tensor([2, 0, 1])
    _, bound = pair_sums(x, w, rows, cols, first.x_norm, first.w_norm)
    assert (bound < first.bound()[rows, cols] * 2.0**-10).all()


def test_norm_bounds_cover_the_norms():
    generator = torch.Generator().manual_seed(8)
    x = wide_random((6, 33), torch.float32, generator, 120)
    norms = upper_norms(x.double())
    for row, norm in zip(x.double().tolist(), norms.tolist()):
        assert Fraction(norm) ** 2 >= sum(Fraction(v) ** 2 for v in row)


def test_gamma_is_the_relative_error_of_its_additions():
    assert gamma(1) > 2.0**-52 and gamma(1 << 20) < 2.0**-31


def test_near_zero_outputs_reach_the_pair_sums_and_settle():
    # a.b - a.(b (1 + 2**-20)): outputs about 2**-20 of their terms, below the float64 product's bound.
    generator = torch.Generator().manual_seed(6)
    a, b = torch.randn(8, 200, generator=generator), torch.randn(6, 200, generator=generator)
    x, w = torch.cat([a, a], 1), torch.cat([b, -b * (1 + 2.0**-20)], 1)
    result = det_gemm(x, w)
    stats = bounded_gemm.last_statistics
    assert stats.pairs > 0 and stats.pairs_settled > 0
    assert same_bits(result, oracle_gemm(x, w, BINARY32))


def test_cancelling_data_goes_on_to_the_tiers_and_the_accumulator():
    generator = torch.Generator().manual_seed(9)
    x, w = KINDS["cancellation"](80, 64, 40, torch.float32, generator)  # more outputs than PAIR_MINIMUM
    result = det_gemm(x, w)
    stats = bounded_gemm.last_statistics
    assert stats.tiers > 0 and stats.pairs == 0 and stats.fallback > 0
    assert same_bits(result, round_planes(accumulate_planes(x, w), torch.float32))


@pytest.mark.parametrize("path", ["default", "float64"])
def test_randn_settles_in_the_float64_product(path):
    generator = torch.Generator().manual_seed(10)
    x, w = torch.randn(96, 700, generator=generator), torch.randn(80, 700, generator=generator)
    with contextlib.nullcontext() if path == "default" else bounded_gemm.forced(path):
        result = det_gemm(x, w)
    stats = bounded_gemm.last_statistics
    assert stats.first_settled > 0.98 * 96 * 80 and stats.tiers == 0 and stats.fallback == 0
    assert same_bits(result, round_planes(accumulate_planes(x, w), torch.float32))


def test_a_small_output_with_a_long_k_takes_short_chunks_side_by_side():
    """512 x 512 outputs over 16384 columns: chunks of 128 side by side, D = 257 instead of
    1041; a large output keeps CHUNK in turn."""
    assert float64_stage.chunk_for(512 * 512, 16384) == 128
    assert float64_stage.chunk_for(8192 * 8192, 8192) == float64_stage.CHUNK
    assert float64_stage.chunk_for(512 * 512, 16384, batched=True) == float64_stage.CHUNK


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_short_chunks_side_by_side_give_the_exact_rounding(kind):
    """K = 3000 (chunks of 64, a part chunk last) through det_gemm's default path: the oracle's bits."""
    generator = torch.Generator().manual_seed(len(kind))
    x, w = KINDS[kind](4, 3, 3000, torch.float32, generator)
    assert float64_stage.chunk_for(4 * 3, 3000) == 64
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w, BINARY32))
