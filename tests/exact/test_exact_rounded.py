"""det_gemm's fast path (bounded_gemm.py): bit for bit the exact path's result and the Fraction
oracle's, on every path: the default stages, the float64 stages alone (float64 product and
pair sums), and the tiers alone with both tier products (the int8 tensor cores' arithmetic
through its CPU stand-in, and fp64), on random and adversarial data; forced fallback;
settled fractions."""

import contextlib
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adversarial import KINDS
from exact_oracle import BFLOAT16, BINARY32, oracle_gemm, same_bits
from exact_random import wide_random
from exact_strategies import gemm_operands
from sexpgpu.exact import DetLinear, det_finalize, det_gemm, det_gemm_partial, det_sum_partial
from sexpgpu.exact import bounded_gemm
from sexpgpu.exact.gemm import accumulate_planes
from sexpgpu.exact.rounding import round_planes

PATHS = ["default", "float64", "int8", "fp64"]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(params=PATHS)
def tiers(request):
    path = contextlib.nullcontext() if request.param == "default" else bounded_gemm.forced(request.param)
    with path:
        yield request.param


def settled(stats) -> int:
    return stats.first_settled + stats.pairs_settled + sum(stats.settled_after)


def exact_path(x, w, dtype=torch.float32):
    return round_planes(accumulate_planes(x, w), dtype)


def fast_path(x, w, dtype=torch.float32):
    from sexpgpu.exact.special import split_special

    finite_x, finite_w, special = split_special(x, w)
    return bounded_gemm.rounded_gemm(finite_x, finite_w, special, dtype, accumulate_planes)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_adversarial_data_gives_the_exact_path_and_the_oracle(tiers, kind, dtype):
    generator = torch.Generator().manual_seed(len(kind) + 7)
    x, w = KINDS[kind](4, 3, 150, dtype, generator)
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w, BINARY32))
    assert same_bits(fast_path(x, w, torch.bfloat16), oracle_gemm(x, w, BFLOAT16))


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_bit_patterns_give_the_oracle(tiers, dtype, data):
    x, w = data.draw(gemm_operands(dtype, max_m=3, max_n=3, max_k=12))
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w, BINARY32))
    assert same_bits(fast_path(x, w, torch.bfloat16), oracle_gemm(x, w, BFLOAT16))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), spread=st.sampled_from([1, 3, 30, 150]), k=st.integers(1, 300),
       negate=st.booleans())
def test_larger_random_products_equal_the_exact_path(tiers, seed, spread, k, negate):
    generator = torch.Generator().manual_seed(seed)
    x, w = wide_random((9, k), torch.float32, generator, spread), wide_random((7, k), torch.float32, generator, spread)
    if negate:  # x and -x side by side: every sum cancels to the second half's leftovers
        x, w = torch.cat([x, x, x[:, :1]], 1), torch.cat([w, -w, w[:, :1]], 1)
    assert same_bits(det_gemm(x, w), exact_path(x, w))


def test_exact_ties_at_float32_midpoints(tiers):
    # 1 + 2**-24 is the midpoint between 1 and 1 + 2**-23: ties to even (1); a hair more rounds up.
    x = torch.tensor([[1.0, 2.0**-24, 0.0], [1.0, 2.0**-24, 2.0**-60], [1.0 + 2.0**-23, 2.0**-24, 0.0]])
    w = torch.ones(1, 3)
    assert det_gemm(x, w).flatten().tolist() == [1.0, 1.0 + 2.0**-23, 1.0 + 2.0**-22]
    # -(1 + 2**-24): ties to even in magnitude, keeping the sign.
    assert det_gemm(-x[:1], w).item() == -1.0


def test_subnormal_results_and_ties(tiers):
    tie = torch.tensor([[2.0**-75]])
    assert det_gemm(tie, tie).item() == 0.0  # 2**-150, between 0 and the smallest subnormal
    assert det_gemm(torch.tensor([[2.0**-75, 2.0**-100]]), torch.tensor([[2.0**-75, 2.0**-100]])).item() == 2.0**-149
    x = torch.tensor([[2.0**-149, 3 * 2.0**-149, -(2.0**-126)]])
    w = torch.tensor([[0.5, 1.5, 2.0**-20]])
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w))


def test_largest_finite_values_and_overflow(tiers):
    big = 3.4028234663852886e38
    x = torch.tensor([[big, big, -big], [big, 2.0**103, 0.0], [big, 2.0**102, 0.0], [big, 2.0**102, 2.0**70]])
    w = torch.ones(1, 3)
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w))
    assert det_gemm(x, w).flatten().tolist()[1:] == [math.inf, big, big]


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_and_zeros(tiers, dtype):
    x = torch.tensor([[math.nan, 1.0, 0.0], [math.inf, 2.0, 1.0], [-0.0, 0.0, 0.0], [1.0, -1.0, 3.0]], dtype=dtype)
    w = torch.tensor([[1.0, 1.0, 1.0], [0.0, 5.0, -5.0], [-0.0, -0.0, 2.0]], dtype=dtype)
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w))


def test_empty_shapes(tiers):
    assert torch.equal(det_gemm(torch.zeros(2, 0), torch.zeros(3, 0)), torch.zeros(2, 3))
    assert det_gemm(torch.zeros(0, 4), torch.zeros(3, 4)).shape == (0, 3)
    assert det_gemm(torch.zeros(2, 4), torch.zeros(0, 4)).shape == (2, 0)


@pytest.mark.parametrize("k", [bounded_gemm.TIER_FP64.k_block - 1, bounded_gemm.TIER_FP64.k_block + 3, 3 * 4096 + 1])
def test_k_near_and_across_the_call_width(tiers, k):
    generator = torch.Generator().manual_seed(k)
    x, w = wide_random((3, k), torch.float32, generator, 10), wide_random((2, k), torch.float32, generator, 10)
    x[:, k // 2:] *= 2.0**-40
    assert same_bits(det_gemm(x, w), exact_path(x, w))


def test_int8_tier_calls_split_wide_tiers():
    # A tier wider than one int8 call (2**17 columns) is cut into several calls.
    generator = torch.Generator().manual_seed(5)
    k = (1 << 16) + 5
    x, w = wide_random((2, k), torch.float32, generator, 4), wide_random((2, k), torch.float32, generator, 4)
    with bounded_gemm.forced("int8"):
        assert same_bits(det_gemm(x, w), exact_path(x, w))
    assert bounded_gemm.last_statistics.tiers >= 2


def test_cancellation_forces_the_fallback(tiers):
    # Products near 2**200 that cancel exactly leave sums near 2**-200: no tier bound can settle them.
    generator = torch.Generator().manual_seed(3)
    x, w = KINDS["cancellation"](5, 4, 40, torch.float32, generator)
    x[:, :2] *= 2.0**60
    result = det_gemm(x, w)
    assert bounded_gemm.last_statistics.fallback > 0
    assert same_bits(result, oracle_gemm(x, w))


def test_randn_settles_without_the_fallback(tiers):
    generator = torch.Generator().manual_seed(1)
    x, w = torch.randn(64, 512, generator=generator), torch.randn(48, 512, generator=generator)
    result = det_gemm(x, w)
    stats = bounded_gemm.last_statistics
    assert same_bits(result, exact_path(x, w))
    assert stats.fallback == 0 and settled(stats) == 64 * 48
    first = stats.first_settled or stats.settled_after[0]
    assert first > 0.9 * 64 * 48  # most outputs settle at the first check


def test_forced_implementation_takes_the_exact_path():
    from sexpgpu.exact import implementations

    x, w = torch.randn(3, 5), torch.randn(2, 5)
    with implementations.forced("bins"):
        bounded_gemm.last_statistics = bounded_gemm.Statistics()
        det_gemm(x, w)
    assert bounded_gemm.last_statistics.outputs == 0


def test_unknown_tier_products_are_refused():
    with pytest.raises(ValueError, match="no tier products named 'int4'"):
        with bounded_gemm.forced("int4"):
            pass


@pytest.mark.parametrize("dtype", DTYPES)
def test_det_linear_takes_the_fast_path_with_the_same_bits(tiers, dtype):
    generator = torch.Generator().manual_seed(2)
    x, weight = wide_random((6, 9), dtype, generator, 20), wide_random((4, 9), dtype, generator, 20)
    bias, grad_y = wide_random((4,), dtype, generator, 20), wide_random((6, 4), dtype, generator, 20)
    layer = DetLinear(9, 4, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    xi = x.clone().requires_grad_(True)
    y = layer(xi)
    y.backward(grad_y)
    ones = torch.ones(6, 1, dtype=dtype)
    assert same_bits(y, det_finalize(det_gemm_partial(torch.cat([x, ones], 1), torch.cat([weight, bias[:, None]], 1)), dtype))
    assert same_bits(xi.grad, det_finalize(det_gemm_partial(grad_y, weight.t()), dtype))
    assert same_bits(layer.weight.grad, det_finalize(det_gemm_partial(grad_y.t(), x.t()), dtype))
    assert same_bits(layer.bias.grad, det_finalize(det_sum_partial(grad_y, 0), dtype))
    assert bounded_gemm.last_statistics.outputs == 4  # the bias gradient, the last sum, went through bounded_gemm.py
