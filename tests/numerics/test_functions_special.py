"""Special values of every function, bit for bit against the mpmath oracle: signed zeros,
infinities, NaN, subnormal inputs and outputs, and the overflow and underflow edges."""

import numpy as np
import pytest

import numerics_reference as ref
from sexpgpu import numerics as nx

NAMES = ("exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "cos", "sin", "rsqrt")
EDGES = [
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
    0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000,  # subnormal edges
    0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000, 0x3F7FFFFF, 0xBF7FFFFF, 0x3F800001,
    0x42B17217, 0x42B17218, 0x42B17219,  # exp overflows from 0x42B17218 (88.72284)
    0xC2CFF1B4, 0xC2CFF1B5, 0xC2CE8ED0, 0xC2CE8ED1,  # exp to 0 and to the smallest subnormal
    0xC2AEAC4F, 0xC2AEAC50,  # exp leaves the normal range
    0x33800000, 0xB3800000, 0x33000000, 0xB3000000, 0x39800000, 0xB9800000,  # near 1 and 0
    0x40490FDB, 0x3FC90FDB, 0x4B800000, 0x5F800000, 0x7E800000,  # pi, pi/2, large arguments
    0xC1100000, 0x41100000, 0x40800000, 0xC0800000, 0x40FFFFFF,  # saturation of tanh, erf
    0xC2C80000, 0x42C80000, 0x41880000, 0xC1880000,  # sigmoid tails
    0xBF7FFFFF, 0xBF800001, 0xC0000000,  # log1p near and below -1
]


@pytest.mark.parametrize("name", NAMES)
def test_special_inputs_round_correctly(name):
    bits = np.array(EDGES, dtype=np.uint32)
    got = getattr(nx, name)(bits.view(np.float32)).view(np.uint32)
    for b, g in zip(EDGES, got):
        assert int(g) == ref.correct(name, b), f"{name}(0x{b:08x}) = 0x{int(g):08x}"


@pytest.mark.parametrize("name", NAMES)
def test_every_subnormal_binade_of_inputs(name):
    rng = np.random.default_rng(7)
    bits = np.concatenate([(np.uint32(1) << np.arange(23, dtype=np.uint32)),
                           rng.integers(1, 0x800000, 200, dtype=np.uint32)])
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    got = getattr(nx, name)(bits.view(np.float32)).view(np.uint32)
    for b, g in zip(bits, got):
        assert int(g) == ref.correct(name, b), f"{name}(0x{int(b):08x})"


def test_nan_results_are_the_canonical_quiet_nan():
    x = np.array([np.nan, -np.nan, np.inf, -1.0], np.float32)
    assert (nx.log(x[[0, 1, 3]]).view(np.uint32) == 0x7FC00000).all()
    assert (nx.sin(x[[0, 2]]).view(np.uint32) == 0x7FC00000).all()
    assert (nx.rsqrt(x[[1, 3]]).view(np.uint32) == 0x7FC00000).all()
