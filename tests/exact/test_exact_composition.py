"""Partial sums compose over any partition of K and any grouping, to the same digits."""

from fractions import Fraction

import pytest
import torch

from exact_oracle import round_fraction
from exact_random import random_cuts, random_fold, shard_partials, wide_random
from sexpgpu.exact import det_combine, det_finalize, det_gemm, det_gemm_partial, det_sum, det_sum_partial
from sexpgpu.exact.layout import MAX_K_PER_CALL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("parts", [2, 4, 8, 16])
def test_k_shards_in_any_grouping_give_the_same_digits(implementation, dtype, parts):
    generator = torch.Generator().manual_seed(1000 * parts + (dtype == torch.bfloat16))
    x = wide_random((6, 257), dtype, generator)
    w = wide_random((5, 257), dtype, generator)
    whole = det_gemm_partial(x, w)
    for _ in range(2):
        partials = shard_partials(x, w, random_cuts(257, parts, generator))
        flat, folded = det_combine(partials), random_fold(partials, generator)
        assert torch.equal(flat.digits, whole.digits)
        assert torch.equal(folded.digits, whole.digits)
        assert torch.equal(det_finalize(folded), det_gemm(x, w))


def test_float32_sharding_moves_bits_that_exact_sharding_does_not(implementation):
    # The contrast the library exists for: the same shards summed in float32 differ.
    generator = torch.Generator().manual_seed(7)
    x, w = torch.randn(64, 1024, generator=generator), torch.randn(32, 1024, generator=generator)
    float_sharded = sum(x[:, a : a + 256] @ w[:, a : a + 256].T for a in range(0, 1024, 256))
    assert not torch.equal(float_sharded, x @ w.T)
    exact_sharded = det_finalize(det_combine(shard_partials(x, w, [256, 512, 768])))
    assert torch.equal(exact_sharded, det_gemm(x, w))


def test_sum_partials_compose_along_the_summed_dimension(implementation):
    generator = torch.Generator().manual_seed(3)
    x = wide_random((3, 4, 100), torch.float32, generator)
    cuts = random_cuts(100, 5, generator)
    bounds = [0, *cuts, 100]
    pieces = [det_sum_partial(x[:, :, a:b], 2) for a, b in zip(bounds[:-1], bounds[1:])]
    assert torch.equal(det_combine(pieces).digits, det_sum_partial(x, 2).digits)
    assert torch.equal(det_finalize(random_fold(pieces, generator)), det_sum(x, 2))


def test_k_beyond_one_call_normalises_its_carries(implementation):
    # More products than one backend call takes, each near the top of the digit range and
    # of one sign, so the digits must carry between calls to stay exact.
    k = MAX_K_PER_CALL + 3
    generator = torch.Generator().manual_seed(5)
    significands = torch.randint(2**23, 2**24, (k,), generator=generator)
    values = (significands.double() * 2.0**80).to(torch.float32)  # exact: 24 bits
    total = det_sum_partial(values.reshape(1, k), 1)
    expected = sum(significands.tolist()) * 2**80
    assert det_finalize(total).item() == round_fraction(Fraction(expected))
    halves = [det_sum_partial(values[: k // 3].reshape(1, -1), 1), det_sum_partial(values[k // 3 :].reshape(1, -1), 1)]
    assert torch.equal(det_combine(halves).digits, total.digits)
