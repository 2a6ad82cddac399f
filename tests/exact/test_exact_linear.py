"""DetLinear: forward and the three gradients are exact sums rounded once."""

import pytest
import torch

from exact_oracle import BFLOAT16, BINARY32, oracle_gemm, same_bits
from exact_random import wide_random
from sexpgpu.exact import DetLinear

FORMATS = {torch.float32: BINARY32, torch.bfloat16: BFLOAT16}


def layer_with(weight, bias, **options):
    layer = DetLinear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype, **options)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


def forward_backward(layer, x, grad_y):
    x = x.clone().requires_grad_(True)
    y = layer(x)
    y.backward(grad_y)
    return y.detach(), x.grad, layer.weight.grad, None if layer.bias is None else layer.bias.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_and_gradients_match_the_oracle(dtype):
    generator = torch.Generator().manual_seed(11)
    x, weight = wide_random((5, 7), dtype, generator, 20), wide_random((3, 7), dtype, generator, 20)
    bias, grad_y = wide_random((3,), dtype, generator, 20), wide_random((5, 3), dtype, generator, 20)
    y, grad_x, grad_w, grad_b = forward_backward(layer_with(weight, bias), x, grad_y)
    fmt = FORMATS[dtype]
    ones = torch.ones(5, 1, dtype=dtype)
    # The bias is one more product, bias * 1, inside the same exact sum: y rounds once.
    assert same_bits(y, oracle_gemm(torch.cat([x, ones], 1), torch.cat([weight, bias[:, None]], 1), fmt))
    assert same_bits(grad_x, oracle_gemm(grad_y, weight.t(), fmt))
    assert same_bits(grad_w, oracle_gemm(grad_y.t(), x.t(), fmt))
    assert same_bits(grad_b, oracle_gemm(grad_y.t(), ones.t(), fmt).reshape(3))
    assert y.dtype == grad_x.dtype == grad_w.dtype == grad_b.dtype == dtype


def test_k_sharded_forward_gives_the_same_bits():
    generator = torch.Generator().manual_seed(12)
    x, weight = torch.randn(16, 40, generator=generator), torch.randn(8, 40, generator=generator)
    bias, grad_y = torch.randn(8, generator=generator), torch.randn(16, 8, generator=generator)
    reference = forward_backward(layer_with(weight, bias), x, grad_y)
    for k_shards in (2, 4, [3, 5, 39], [0, 40]):
        sharded = forward_backward(layer_with(weight, bias, k_shards=k_shards), x, grad_y)
        for a, b in zip(reference, sharded):
            assert torch.equal(a, b)


def test_leading_dimensions_and_no_bias():
    generator = torch.Generator().manual_seed(13)
    x, weight = torch.randn(2, 3, 6, generator=generator), torch.randn(4, 6, generator=generator)
    layer = layer_with(weight, None)
    y = layer(x)
    assert y.shape == (2, 3, 4) and layer.bias is None
    assert same_bits(y.reshape(6, 4), oracle_gemm(x.reshape(6, 6), weight))


def test_initialisation_follows_nn_linear_bounds():
    torch.manual_seed(0)
    layer = DetLinear(64, 32)
    bound = 64**-0.5
    assert layer.weight.shape == (32, 64) and layer.bias.shape == (32,)
    assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound
    assert "in_features=64, out_features=32, bias=True" in repr(layer)
