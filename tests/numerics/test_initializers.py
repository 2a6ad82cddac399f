"""Initializers: fan rules of docs/language.md, scales, and their draws."""

import math

import numpy as np
import pytest

from sexpgpu import numerics as nx

KEY = nx.stream_key(9, "model/w")


@pytest.mark.parametrize("shape, fans", [((), (1, 1)), ((7,), (7, 7)), ((5, 3), (3, 5)),
                                         ((8, 4, 3, 3), (36, 72)), ((2, 3, 5), (15, 10))])
def test_fans(shape, fans):
    assert nx.fans(shape) == fans


def test_scaled_initializers_are_the_documented_draws():
    shape = (64, 32, 3)
    fan_in, fan_out = 96, 192
    a = math.sqrt(6 / (fan_in + fan_out))
    assert np.array_equal(nx.initialize("glorot-uniform", KEY, shape), nx.uniform(KEY, shape, -a, a))
    assert np.array_equal(nx.initialize("glorot-normal", KEY, shape),
                          nx.normal(KEY, shape, 0.0, math.sqrt(2 / (fan_in + fan_out))))
    a = math.sqrt(6 / fan_in)
    assert np.array_equal(nx.initialize("he-uniform", KEY, shape), nx.uniform(KEY, shape, -a, a))
    assert np.array_equal(nx.initialize("he-normal", KEY, shape),
                          nx.normal(KEY, shape, 0.0, math.sqrt(2 / fan_in)))
    assert np.array_equal(nx.initialize("small-init", KEY, shape),
                          nx.normal(KEY, shape, 0.0, math.sqrt(2 / (5 * 3))))


def test_scales_show_in_the_samples():
    w = nx.initialize("he-normal", KEY, (512, 256))
    assert abs(w.std() - math.sqrt(2 / 256)) < 0.002
    w = nx.initialize("glorot-uniform", KEY, (512, 256))
    limit = math.sqrt(6 / 768)
    assert w.min() >= -limit and w.max() < limit and w.max() > 0.99 * limit


def test_parameters_and_constants():
    assert np.array_equal(nx.initialize("zeros", KEY, (2, 3)), np.zeros((2, 3), np.float32))
    assert nx.initialize("ones", KEY, 4).dtype == np.float32
    assert np.array_equal(nx.initialize("normal", KEY, 10, mean=1.0, std=0.1),
                          nx.normal(KEY, 10, 1.0, 0.1))
    assert np.array_equal(nx.initialize("truncated-normal", KEY, 10, std=0.02, bound=3.0),
                          nx.truncated_normal(KEY, 10, 0.0, 0.02, 3.0))
    assert np.array_equal(nx.initialize("uniform", KEY, 10, low=-1.0, high=1.0),
                          nx.uniform(KEY, 10, -1.0, 1.0))
    assert nx.initialize("he-normal", KEY, (0, 5)).shape == (0, 5)


def test_torch_cpu_device():
    torch = pytest.importorskip("torch")
    t = nx.initialize("glorot-normal", KEY, (6, 4), device="cpu")
    assert isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), nx.initialize("glorot-normal", KEY, (6, 4)))
    assert nx.initialize("ones", KEY, 3, device="cpu").dtype == torch.float32


def test_bad_names_and_parameters():
    with pytest.raises(ValueError, match="did you mean 'glorot-uniform'"):
        nx.initialize("glorot_uniform", KEY, (3, 3))
    with pytest.raises(TypeError, match="accepted: mean, std"):
        nx.initialize("normal", KEY, 3, scale=2.0)
    with pytest.raises(TypeError, match="no parameter gain"):
        nx.initialize("he-normal", KEY, (3, 3), gain=2.0)
    with pytest.raises(ValueError, match="at least one axis"):
        nx.initialize("small-init", KEY, ())
