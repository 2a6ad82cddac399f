"""What the functions accept and return: kinds, shapes, strides, dtypes."""

import numpy as np
import pytest

from sexpgpu import numerics as nx

NAMES = ("exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "cos", "sin", "rsqrt")


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_strides(name):
    fn = getattr(nx, name)
    x = np.linspace(0.1, 3, 60, dtype=np.float32).reshape(3, 4, 5)
    flat = fn(x.reshape(-1))
    assert np.array_equal(fn(x), flat.reshape(3, 4, 5))
    strided = x.transpose(2, 0, 1)[:, ::2]
    out = fn(strided)
    assert out.shape == strided.shape and out.flags.c_contiguous
    assert np.array_equal(out, fn(np.ascontiguousarray(strided)))
    assert fn(np.zeros((0, 3), np.float32)).shape == (0, 3)
    scalar = fn(np.float32(0.5))
    assert isinstance(scalar, np.float32) and scalar == fn(np.array([0.5], np.float32))[0]
    assert fn(np.array(0.5, np.float32)).shape == ()


@pytest.mark.parametrize("bad, error", [
    (np.ones(3, np.float64), TypeError), (np.ones(3, np.float16), TypeError),
    (np.ones(3, np.int32), TypeError), ([1.0, 2.0], TypeError), (1.0, TypeError)])
def test_other_inputs_are_refused_not_cast(bad, error):
    with pytest.raises(error, match="float32"):
        nx.exp(bad)


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    out = nx.sin(x.t())
    assert isinstance(out, torch.Tensor) and out.shape == (4, 3) and out.dtype == torch.float32
    assert np.array_equal(out.numpy(), nx.sin(x.t().numpy()))
    assert nx.exp(torch.ones(2, requires_grad=True)).requires_grad is False
    with pytest.raises(TypeError, match="torch.float32"):
        nx.exp(torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="same kind"):
        nx.pow(x, np.ones((3, 4), np.float32))
    assert np.array_equal(nx.pow(x, 2).numpy(), nx.pow(x.numpy(), 2))
