"""det_gemm, det_finalize and det_sum against the Fraction oracle, bit for bit."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exact_oracle import BFLOAT16, BINARY32, oracle_gemm, same_bits
from exact_strategies import gemm_operands
from sexpgpu.exact import det_finalize, det_gemm, det_gemm_partial, det_sum

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_det_gemm_is_the_exact_sum_rounded_once(implementation, dtype, data):
    x, w = data.draw(gemm_operands(dtype))
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w, BINARY32))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_finalize_to_bfloat16_rounds_the_exact_sum_once(implementation, data):
    x, w = data.draw(gemm_operands(torch.bfloat16))
    assert same_bits(det_finalize(det_gemm_partial(x, w), torch.bfloat16), oracle_gemm(x, w, BFLOAT16))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_det_sum_is_the_exact_sum_rounded_once(implementation, data):
    x, _ = data.draw(gemm_operands(torch.float32, max_m=4, max_k=20))
    ones = torch.ones(1, x.shape[1])
    assert same_bits(det_sum(x, 1), oracle_gemm(x, ones).reshape(-1))
    assert same_bits(det_sum(x.t(), 0), oracle_gemm(x, ones).reshape(-1))


def test_subnormal_products_and_sums_are_exact(implementation):
    tiny = 2.0**-149
    x = torch.tensor([[tiny, tiny, -tiny, 2.0**-126]])
    w = torch.tensor([[tiny, 2.0**100, 2.0**100, 0.5]])
    # tiny * tiny = 2**-298, far below float32, yet it decides the rounding of what follows.
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w))
    # 2**-150 is the tie between 0 and the smallest subnormal; 2**-200 more breaks it upwards.
    tie = torch.tensor([[2.0**-75]])
    assert det_gemm(tie, tie).item() == 0.0
    above_tie = torch.tensor([[2.0**-75, 2.0**-100]])
    assert det_gemm(above_tie, above_tie).item() == 2.0**-149


def test_a_sum_rounds_once_not_term_by_term(implementation):
    x = torch.tensor([[1.0, 2.0**-24, 2.0**-24]])
    w = torch.ones(1, 3)
    # Term by term, 1 + 2**-24 ties back to 1 twice; exactly, 1 + 2**-23 is representable.
    assert det_gemm(x, w).item() == 1.0 + 2.0**-23


def test_cancellation_leaves_the_small_terms(implementation):
    big = 3.0e38
    x = torch.tensor([[big, 1.5, -big, 2.0**-20]])
    assert det_gemm(x, torch.ones(1, 4)).item() == 1.5 + 2.0**-20


def test_an_exact_zero_is_positive_zero(implementation):
    x = torch.tensor([[-0.0, 5.0, -5.0]])
    w = torch.tensor([[1.0, 1.0, 1.0]])
    result = det_gemm(x, w)
    assert result.item() == 0.0 and math.copysign(1.0, result.item()) == 1.0
    assert math.copysign(1.0, det_gemm(torch.tensor([[-0.0]]), torch.tensor([[1.0]])).item()) == 1.0


def test_a_negative_sum_too_small_for_float32_is_negative_zero(implementation):
    result = det_gemm(torch.tensor([[-(2.0**-100)]]), torch.tensor([[2.0**-100]])).item()
    assert result == 0.0 and math.copysign(1.0, result) == -1.0


def test_overflow_at_finalize_is_signed_infinity(implementation):
    big = 3.0e38
    assert det_gemm(torch.tensor([[big, big]]), torch.tensor([[2.0, 2.0]])).item() == math.inf
    assert det_gemm(torch.tensor([[big, big]]), torch.tensor([[-2.0, -2.0]])).item() == -math.inf
    # An intermediate far beyond float32 is harmless when the total comes back into range.
    x = torch.tensor([[big, big, -big, -big, 1.0]])
    assert det_gemm(x, torch.tensor([[big, big, big, big, 0.25]])).item() == 0.25


@pytest.mark.parametrize(
    "xs, ws, expected",
    [
        ([math.nan, 1.0], [1.0, 1.0], math.nan),
        ([math.inf, 0.0], [0.0, 1.0], math.nan),  # inf * 0
        ([math.inf, -math.inf], [1.0, 1.0], math.nan),  # inf + -inf
        ([math.inf, 1.0], [-2.0, 3.0], -math.inf),
        ([math.inf, math.inf], [1.0, 2.0], math.inf),
        ([-math.inf, 3.0e38], [-1.0, -3.0e38], math.inf),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(implementation, xs, ws, expected, dtype):
    x, w = torch.tensor([xs], dtype=dtype), torch.tensor([ws], dtype=dtype)
    assert same_bits(det_gemm(x, w), torch.tensor([[expected]]))
    products = x * w  # rounded in dtype, so compare det_sum with the oracle of these values
    expected_sum = oracle_gemm(products, torch.ones(1, 2, dtype=dtype), BFLOAT16 if dtype == torch.bfloat16 else BINARY32)
    assert same_bits(det_sum(products, 1), expected_sum.reshape(1))


def test_special_values_stay_in_their_own_outputs(implementation):
    x = torch.tensor([[math.nan, 1.0], [1.0, 2.0]])
    w = torch.tensor([[1.0, 1.0], [0.0, math.inf], [1.0, 1.0]])
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w))


def test_empty_sums_are_zero(implementation):
    assert torch.equal(det_gemm(torch.zeros(2, 0), torch.zeros(3, 0)), torch.zeros(2, 3))
    assert det_gemm(torch.zeros(0, 4), torch.zeros(3, 4)).shape == (0, 3)
    assert same_bits(det_gemm(-torch.zeros(2, 3), torch.ones(4, 3)), torch.zeros(2, 4))
