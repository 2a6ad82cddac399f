"""Splitting kernels across threads changes no bits."""

from __future__ import annotations

import numpy as np
import pytest

from sexpgpu import numerics as nx
from sexpgpu.backends.cpu import folds, parallel


def test_ranges_cover_everything_once_in_order():
    for count in (1, 5, 17, 100):
        for parts in (1, 2, 3, 8):
            bounds = parallel.ranges(count, parts)
            assert bounds[0][0] == 0 and bounds[-1][1] == count
            assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(bounds, bounds[1:]))


def test_matmul_bits_do_not_depend_on_the_thread_count(monkeypatch):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 200, 40)).astype(np.float32)
    b = rng.standard_normal((40, 300)).astype(np.float32)
    results = []
    for threads in ("1", "2", "5"):
        monkeypatch.setenv("SEXPGPU_CPU_THREADS", threads)
        results.append(folds.matmul(a, b).tobytes())
    assert results[0] == results[1] == results[2]


@pytest.mark.skipif(not hasattr(nx, "tanh"), reason="sexpgpu.numerics is not built yet")
def test_elementwise_bits_do_not_depend_on_the_thread_count(monkeypatch):
    x = np.random.default_rng(5).standard_normal((70, 1000)).astype(np.float32)
    results = []
    for threads in ("1", "3"):
        monkeypatch.setenv("SEXPGPU_CPU_THREADS", threads)
        results.append(parallel.elementwise(nx.tanh, x))
    assert results[0].shape == x.shape and results[0].tobytes() == results[1].tobytes()


def test_the_threads_compute_under_the_callers_error_state(monkeypatch):
    """An overflow in a thread's piece is an IEEE value under the interpreter's np.errstate,
    as in the calling thread: no warning (before, numpy's default state warned in the pool)."""
    import warnings

    monkeypatch.setenv("SEXPGPU_CPU_THREADS", "2")
    big = np.full(4 * parallel.MIN_ELEMENTS, 1e30, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="ignore"):
            product = parallel.elementwise(np.multiply, big, big)
            parallel.run_ranges(lambda start, stop: big[start:stop] * big[start:stop], big.size, big.size)
    assert np.isinf(product).all()
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):  # the caller's state, whatever it is
        parallel.elementwise(np.multiply, big, big)


def test_trailing_sum_bits_do_not_depend_on_the_thread_count(monkeypatch):
    x = (np.random.default_rng(6).standard_normal((301, 257)) * 1e4).astype(np.float32)
    monkeypatch.setattr(folds, "SUM_THREADED", 0)
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 1)
    results = []
    for threads in ("1", "2", "5"):
        monkeypatch.setenv("SEXPGPU_CPU_THREADS", threads)
        results.append(folds.reduce_sum(x, (1,)).tobytes())
    assert results[0] == results[1] == results[2]
