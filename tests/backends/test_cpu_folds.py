"""The interpreter's sums and products fold in the documented order, and nothing else.

The oracle is a plain Python loop over numpy float32 scalars: acc = x0, acc = acc + x1, ...
Cases are chosen where numpy's pairwise np.sum gives other bits, so a fold that silently
fell back to it would fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from sexpgpu.backends.cpu import folds


def _sequential(values) -> np.float32:
    acc = np.float32(values[0])
    for value in values[1:]:
        acc = np.float32(acc + np.float32(value))
    return acc


def _ill_conditioned(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count) * np.exp(rng.uniform(-8, 8, count))).astype(np.float32)


@pytest.mark.parametrize("count", [1, 2, 7, 127, 128, 1000, 20000])
def test_full_sum_is_the_left_fold(count):
    x = _ill_conditioned(count)
    assert folds.reduce_sum(x, (0,)).tobytes() == _sequential(x).tobytes()


def test_the_fold_differs_from_numpy_pairwise_sum_somewhere():
    x = _ill_conditioned(20000, seed=3)
    assert folds.reduce_sum(x, (0,)) != np.sum(x), "pick a case where the orders give other bits"


@pytest.mark.parametrize("shape, axes", [((40, 3), (0,)), ((3, 300), (1,)), ((5, 6, 7), (0, 2)), ((200, 130), (0,)),
                                         ((4, 5, 6), (1, 2)), ((2, 3), ()), ((9, 1), (1,)), ((7, 3, 50), (2,)),
                                         ((4, 5, 6), (2, 1)), ((600, 70), (1,))])
def test_axis_sums_fold_in_c_order_of_the_reduced_axes(shape, axes):
    x = _ill_conditioned(int(np.prod(shape))).reshape(shape)
    result = folds.reduce_sum(x, axes)
    kept = [axis for axis in range(x.ndim) if axis not in axes]
    moved = np.transpose(x, list(axes) + kept).reshape((-1,) + tuple(x.shape[a] for a in kept))
    expected = np.empty(result.shape, np.float32)
    for index in np.ndindex(expected.shape):
        expected[index] = _sequential(moved[(slice(None),) + index]) if axes else x[index]
    assert result.tobytes() == expected.tobytes()


def test_trailing_sums_of_strided_values_and_their_nan():
    """Trailing-axis sums (a compiled loop over each output's contiguous terms) read a
    transposed x as its values, keep infinities and signed zeros, and give every NaN sum as
    0x7FC00000 whatever the signs and payloads of its terms."""
    x = _ill_conditioned(6 * 50).reshape(50, 6).T
    assert folds.reduce_sum(x, (1,)).tobytes() == np.array([_sequential(row) for row in x], np.float32).tobytes()
    special = np.array([[np.inf, 1.0, 2.0], [-0.0, -0.0, -0.0], [-np.inf, np.inf, 1.0], [1.0, -np.nan, 2.0],
                        [np.inf, 3.0, -5.0]], np.float32)
    with np.errstate(invalid="ignore"):
        got = folds.reduce_sum(special, (1,))
    quiet = np.float32(np.nan).view(np.uint32)
    assert got.view(np.uint32).tolist() == [0x7F800000, 0x80000000, quiet, quiet, 0x7F800000]


def test_keep_dims_shape():
    x = np.ones((2, 3, 4), np.float32)
    assert folds.reduce_sum(x, (0, 2), keep=True).shape == (1, 3, 1)
    assert folds.reduce_max(x, (1,), keep=True).shape == (2, 1, 4)


@pytest.mark.parametrize("a_shape, b_shape", [((3, 5), (5, 2)), ((4, 300), (300, 3)), ((2, 3, 20), (20, 4)),
                                              ((7, 9), (3, 9, 130)), ((2, 1, 3, 4), (5, 4, 2)), ((70, 8), (8, 300)),
                                              ((2, 300, 5), (5, 300))])
def test_matmul_folds_products_over_k_in_order(a_shape, b_shape):
    rng = np.random.default_rng(1)
    a = _ill_conditioned(int(np.prod(a_shape)), 1).reshape(a_shape)
    b = rng.standard_normal(b_shape).astype(np.float32)
    result = folds.matmul(a, b)
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    big_a = np.broadcast_to(a, batch + a_shape[-2:])
    big_b = np.broadcast_to(b, batch + b_shape[-2:])
    expected = big_a[..., :, 0, None] * big_b[..., None, 0, :]
    for k in range(1, a_shape[-1]):
        expected = (expected + big_a[..., :, k, None] * big_b[..., None, k, :]).astype(np.float32)
    assert result.shape == expected.shape
    assert result.tobytes() == expected.tobytes()
    np.testing.assert_allclose(result, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-3 * np.abs(a).max())


def test_matmul_with_no_terms_is_zero():
    assert np.array_equal(folds.matmul(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)), np.zeros((2, 3)))


def test_maximum_and_minimum_are_ieee_2019():
    a = np.array([0.0, -0.0, -0.0, 1.0, np.nan], np.float32)
    b = np.array([-0.0, 0.0, -0.0, np.nan, 2.0], np.float32)
    top = folds.ieee_maximum(a, b)
    assert list(np.signbit(top[:3])) == [False, False, True]
    assert np.isnan(top[3]) and np.isnan(top[4])
    bottom = folds.ieee_minimum(a, b)
    assert list(np.signbit(bottom[:3])) == [True, True, True]


def test_max_reduction_prefers_positive_zero_whatever_the_order():
    for values in ([-0.0, 0.0, -1.0], [0.0, -0.0, -1.0], [-1.0, -0.0, 0.0]):
        result = folds.reduce_max(np.array(values, np.float32), (0,))
        assert result == 0 and not np.signbit(result)
    assert np.signbit(folds.reduce_max(np.array([-0.0, -3.0], np.float32), (0,)))
    assert np.isnan(folds.reduce_max(np.array([1.0, np.nan, 2.0], np.float32), (0,)))
