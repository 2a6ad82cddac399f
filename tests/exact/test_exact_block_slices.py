"""Slices under shared exponents (the int8 tensor-core arithmetic, run on CPU, and wide fp64
slices): bit for bit against the Fraction oracle and every other implementation, on data
chosen to defeat the slicing: exponents over the whole range in one row, cancellation,
subnormals, outliers, K across block edges and at its limit."""

from fractions import Fraction

import pytest
import torch

from adversarial import KINDS
from exact_oracle import BFLOAT16, BINARY32, oracle_gemm, round_fraction, same_bits
from exact_random import EVERY_CPU_IMPLEMENTATION, wide_random
from sexpgpu.exact import det_finalize, det_gemm, det_gemm_partial
from sexpgpu.exact import implementations
from sexpgpu.exact.accumulator import normalise_
from sexpgpu.exact.block_slices import (
    FP64_WIDE,
    INT8_ON_CPU,
    INT8_TENSOR_CORES,
    SliceProducts,
    accumulate_with,
    fp64_products,
)
from sexpgpu.exact.layout import MAX_K_PER_CALL

SLICED = ["int8", "fp64"]
DTYPES = [torch.float32, torch.bfloat16]


def digits_with(name, x, w):
    with implementations.forced(name):
        return det_gemm_partial(x, w).digits


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_adversarial_data_gives_the_oracle_and_the_reference_digits(kind, dtype):
    generator = torch.Generator().manual_seed(len(kind))
    x, w = KINDS[kind](3, 2, 150, dtype, generator)
    reference = digits_with("bins", x, w)
    expected = oracle_gemm(x, w, BINARY32)
    expected_bf16 = oracle_gemm(x, w, BFLOAT16)
    for name in EVERY_CPU_IMPLEMENTATION[1:]:
        acc = det_gemm_partial_with(name, x, w)
        assert torch.equal(acc.digits, reference), name
        assert same_bits(det_finalize(acc), expected), name
        assert same_bits(det_finalize(acc, torch.bfloat16), expected_bf16), name


def det_gemm_partial_with(name, x, w):
    with implementations.forced(name):
        return det_gemm_partial(x, w)


@pytest.mark.parametrize("name, k", [("int8", INT8_ON_CPU.k_block + 1), ("int8", INT8_ON_CPU.k_block - 1),
                                     ("fp64", 3 * FP64_WIDE.k_block + 5)])
def test_k_across_block_edges(name, k):
    # Each block has its own exponents: a row that is tiny in one block and huge in the next.
    generator = torch.Generator().manual_seed(k)
    x, w = wide_random((2, k), torch.float32, generator, 30), wide_random((3, k), torch.float32, generator, 30)
    x[:, k // 2:] *= 2.0**-90
    assert torch.equal(digits_with(name, x, w), digits_with("bins", x, w))


def exact_dot_by_integers(xs, ws) -> Fraction:
    """sum(x * w) exactly: every product of floats is an integer multiple of 2**-298."""
    total = 0
    for x, w in zip(xs, ws):
        (xn, xd), (wn, wd) = x.as_integer_ratio(), w.as_integer_ratio()
        total += (xn * wn) << (298 - (xd * wd).bit_length() + 1)
    return Fraction(total, 1 << 298)


@pytest.mark.parametrize("name", SLICED)
def test_k_at_its_limit(name):
    # 2**19 products of mixed sizes into one output (one backend call), then twice that,
    # where the second half cancels the first but for its last term: x_l * (w_l + 3/4) remains.
    generator = torch.Generator().manual_seed(19)
    x = wide_random((1, MAX_K_PER_CALL), torch.float32, generator, 12)
    w = wide_random((1, MAX_K_PER_CALL), torch.float32, generator, 12)
    x2, w2 = torch.cat([x, x], 1), torch.cat([w, -w], 1)
    w2[0, -1] = 0.75
    x_last, w_last = Fraction(x[0, -1].item()), Fraction(w[0, -1].item())
    with implementations.forced(name):
        whole = det_gemm(x, w).item()
        cancelled = det_gemm(x2, w2).item()
    assert whole == round_fraction(exact_dot_by_integers(x[0].double().tolist(), w[0].double().tolist()))
    assert cancelled == round_fraction(x_last * (w_last + Fraction(3, 4)))


@pytest.mark.parametrize("m, n, k", [(5, 7, 13), (17, 16, 16), (40, 3, 301)])
def test_the_tensor_core_call_with_its_padding_gives_the_reference_digits(m, n, k):
    # torch._int_mm also runs on CPU: the CUDA path's padding and layout, checked here.
    generator = torch.Generator().manual_seed(m * n * k)
    x, w = wide_random((m, k), torch.float32, generator, 12), wide_random((n, k), torch.float32, generator, 12)
    with implementations.forced("bins"):
        expected = det_gemm_partial(x, w).digits
    assert torch.equal(normalise_(accumulate_with(INT8_TENSOR_CORES, x, w)), expected)


def test_the_fast_cpu_path_is_the_default_on_cpu():
    assert implementations.select(torch.device("cpu")).name == "fp64"


def test_slice_products_refuse_blocks_whose_sums_could_be_inexact():
    with pytest.raises(ValueError, match="exact below 2\\*\\*53"):
        SliceProducts(20, 1 << 14, torch.float64, fp64_products, exact_bits=53)
    with pytest.raises(ValueError, match="exact below 2\\*\\*31"):
        SliceProducts(7, 1 << 18, torch.int8, fp64_products, exact_bits=31)
