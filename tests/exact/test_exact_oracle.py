"""The oracle's own rounding agrees with the platform's correctly rounded conversions."""

import math
import struct
from fractions import Fraction

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exact_oracle import BFLOAT16, BINARY32, round_fraction


def double_from_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


finite_doubles = st.integers(0, 2**64 - 1).map(double_from_bits).filter(math.isfinite)


@settings(max_examples=400, deadline=None)
@given(finite_doubles)
def test_rounding_a_double_to_binary32_matches_torch(value):
    expected = torch.tensor(value, dtype=torch.float64).to(torch.float32).item()
    got = round_fraction(Fraction(value), BINARY32)
    assert math.copysign(1, got) == math.copysign(1, expected) or value == 0
    assert got == expected


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32 - 1).map(lambda b: struct.unpack("<f", struct.pack("<I", b))[0]).filter(math.isfinite))
def test_rounding_a_float32_to_bfloat16_matches_torch(value):
    expected = torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).item()
    assert round_fraction(Fraction(value), BFLOAT16) == expected


def test_ties_go_to_even_and_overflow_goes_to_infinity():
    one_ulp = Fraction(1, 2**23)
    assert round_fraction(1 + one_ulp / 2) == 1.0
    assert round_fraction(1 + 3 * one_ulp / 2) == 1 + 2 * float(one_ulp)
    largest = (2 - 2.0**-23) * 2.0**127
    assert round_fraction(Fraction(largest) + Fraction(2) ** 103) == math.inf  # the halfway point to 2**128
    assert round_fraction(Fraction(largest) + Fraction(2) ** 103 - Fraction(1, 2**200)) == largest
    assert round_fraction(Fraction(1, 2**150)) == 0.0  # a tie between 0 and the smallest subnormal
    assert round_fraction(-Fraction(3, 2**151)) == -(2.0**-149)
