"""pow: C99 Annex F special values, and accuracy against mpmath on random pairs."""

import itertools

import mpmath as mp
import numpy as np
import pytest

import numerics_reference as ref
from sexpgpu import numerics as nx

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, float("inf"),
           float("-inf"), float("nan"), 1e-45, -1e-45, 3.4028235e38, -3.4028235e38, 16777216.0,
           16777217.0, -16777215.0, 8388609.0]


def test_special_values_follow_c99():
    pairs = np.array(list(itertools.product(SPECIAL, SPECIAL)), dtype=np.float32)
    x, y = pairs[:, 0], pairs[:, 1]
    with np.errstate(all="ignore"):
        want = np.power(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)
    got = nx.pow(x, y)
    for xi, yi, g, w in zip(x, y, got, want):
        if np.isnan(w):
            assert g.view(np.uint32) == 0x7FC00000, (xi, yi, g)
        else:
            assert g.view(np.uint32) == w.view(np.uint32), (xi, yi, g, w)


def _pairs(n, seed):
    rng = np.random.default_rng(seed)
    x = (2.0 ** rng.uniform(-30, 30, n)).astype(np.float32)
    log_x = np.log(x.astype(np.float64))
    y = (rng.uniform(-85, 85, n) / np.where(np.abs(log_x) < 1e-3, 1e-3, log_x)).astype(np.float32)
    x[: n // 10] = (1 + rng.uniform(-1e-3, 1e-3, n // 10)).astype(np.float32)
    y[: n // 10] = rng.uniform(-1e5, 1e5, n // 10).astype(np.float32)
    sign = np.where(rng.random(n) < 0.2, -1, 1).astype(np.float32)
    y[: n // 5] = np.round(y[: n // 5])  # integer exponents, negative bases allowed
    return x * np.where(np.arange(n) < n // 5, sign, 1), y


def test_random_pairs_are_within_one_ulp_and_correctly_rounded_off_midpoints():
    x, y = _pairs(12000, 11)
    got = nx.pow(x, y).view(np.uint32)
    checked = 0
    for xi, yi, g in zip(x, y, got):
        v = ref.pow_exact(int(np.float32(abs(xi)).view(np.uint32)), int(yi.view(np.uint32)),
                          negative=bool(xi < 0 and int(yi) % 2 == 1))
        want = ref.round_bits(v)
        if abs(v) > 3.4e38 or want & 0x7FFFFFFF == 0:
            continue
        checked += 1
        if ref.midpoint_distance(v) > mp.mpf(2) ** -27:
            assert int(g) == want, (xi, yi)
        else:
            assert abs(int(g) - want) <= 1, (xi, yi)
    assert checked > 10000


@pytest.mark.parametrize("y", [2.0, 0.5, -1.0, 1.0])
def test_exact_exponents_are_correctly_rounded(y):
    rng = np.random.default_rng(5)
    x = rng.integers(1, 0x7F7FFFFF, 3000, dtype=np.uint32).view(np.float32)
    got = nx.pow(x, y).view(np.uint32)
    for xi, g in zip(x, got):
        v = ref.pow_exact(int(xi.view(np.uint32)), int(np.float32(y).view(np.uint32)))
        assert int(g) == ref.round_bits(v), (xi, y)


def test_exponent_must_be_a_float32_value():
    x = np.ones(3, np.float32)
    assert np.array_equal(nx.pow(x, 3), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="float32 value"):
        nx.pow(x, 0.1)
    with pytest.raises(TypeError, match="float32"):
        nx.pow(x, np.ones(3, np.float64))
    assert nx.pow(np.float32(2), 10) == np.float32(1024)
    assert nx.pow(x[:, None], np.arange(4, dtype=np.float32)).shape == (3, 4)
