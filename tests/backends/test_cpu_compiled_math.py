"""The interpreter's compiled portable functions (backends/cpu/compiled_math.py) give
sexpgpu.numerics' bits: on every hard case of the table (where the table decides the
answer), on the special values, and on random bit patterns of every exponent."""

from __future__ import annotations

import numpy as np
import pytest

from sexpgpu import numerics as nx
from sexpgpu.backends.cpu import compiled_math
from sexpgpu.numerics.portable.hardcases import HARD_CASES

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, 3.4028235e38,
                    -3.4028235e38, 1.0, -1.0, 0.5, 2.0, 88.72284, 88.72283, -103.97208, -87.33655, 3.9192059, 20.0],
                   np.float32)


def _inputs(name: str) -> np.ndarray:
    keys = np.array(sorted(HARD_CASES.get(name, {})), np.uint32)
    random = np.random.default_rng(len(name)).integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    nan_payloads = np.array([0x7F800001, 0xFFC00001, 0x7FFFFFFF], np.uint32)
    words = np.concatenate([keys, keys ^ np.uint32(0x80000000), random, nan_payloads])
    normal = np.random.default_rng(1).standard_normal(1 << 14).astype(np.float32) * np.float32(8)
    underflowing = np.linspace(-104, -87, 1 << 12, dtype=np.float32)  # exp's subnormal results, rounded
    return np.concatenate([words.view(np.float32), SPECIAL, normal, underflowing, -underflowing])


@pytest.mark.parametrize("name", sorted(compiled_math.FUNCTIONS))
def test_compiled_functions_give_the_portable_bits(name):
    x = _inputs(name)
    got = compiled_math.apply(name, np.repeat(x, 2)[::2])  # a strided view of x: read as x
    expected = getattr(nx, name)(x)
    assert got.shape == expected.shape and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_a_zero_dimensional_value_stays_one():
    got = compiled_math.apply("exp", np.array(1.0, np.float32))
    assert got.shape == () and got.view(np.uint32) == nx.exp(np.array([1.0], np.float32)).view(np.uint32)[0]


def test_the_cache_key_holds_the_portable_sources_and_the_function():
    """numba keys a cached loop by its own code, which is one for every function and does
    not change when a portable function does: the key must say both."""
    loop = compiled_math._loop(compiled_math.FUNCTIONS["exp"])
    key = loop._cache._index_key((), loop.targetctx.codegen())
    assert key[-2:] == (compiled_math.sources_hash(), "exp_f32")


def test_a_large_array_split_across_threads_keeps_its_bits(monkeypatch):
    x = np.random.default_rng(3).standard_normal((70, 1000)).astype(np.float32)
    results = []
    for threads in ("1", "3"):
        monkeypatch.setenv("SEXPGPU_CPU_THREADS", threads)
        results.append(compiled_math.apply("erf", x).tobytes())
    assert results[0] == results[1] == nx.erf(x).tobytes()


def _softmax_rows_cases(width: int) -> np.ndarray:
    """(5, width, width) scores: random of many magnitudes, then rows of special values."""
    rng = np.random.default_rng(width)
    x = (rng.standard_normal((5, width, width)) * 10.0 ** rng.integers(-3, 3, (5, width, 1))).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3.4028235e38], np.float32)
    x[1] = rng.choice(specials, (width, width))  # rows of special values, masked or not
    x[2] = rng.choice(np.array([0.0, -0.0], np.float32), (width, width))  # the maximum of signed zeros
    x[3, :, : width // 2 + 1] = -np.inf  # rows whose every kept entry is -inf
    x[4] = np.repeat(x[0, :1], width, axis=0)
    return x


@pytest.mark.parametrize("width", [1, 2, 7, 64, 67])
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_rows_give_the_bits_of_the_softmax_steps(width, causal):
    from sexpgpu.backends.cpu import op_kernels
    from sexpgpu.backends.cpu.arith import PortableF32

    x = _softmax_rows_cases(width)
    masked = np.where(np.tril(np.ones((width, width), bool)), x, np.float32(-np.inf)) if causal else x
    with np.errstate(all="ignore"):
        expected = op_kernels._softmax_along(masked, 2, PortableF32())
    got = compiled_math.softmax_rows(x, causal).probabilities
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
