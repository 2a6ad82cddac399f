"""det_gemm_batched (batched.py): each matrix's outputs have det_gemm's bits and the Fraction
oracle's, on random and adversarial data, in float32 and bfloat16, through every stage (the
float64 product, the pair sums, the exact accumulator) and the matrix-by-matrix path
(non-finite operands, a forced implementation)."""

import pytest
import torch

from adversarial import KINDS
from exact_oracle import BFLOAT16, BINARY32, oracle_gemm, same_bits
from sexpgpu.exact import det_gemm, det_gemm_batched
from sexpgpu.exact import implementations

FORMATS = {torch.float32: BINARY32, torch.bfloat16: BFLOAT16}


def batch_of(kind: str, batch: int, m: int, n: int, k: int, dtype: torch.dtype, seed: int) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    pairs = [KINDS[kind](m, n, k, dtype, generator) for _ in range(batch)]
    return torch.stack([x for x, _ in pairs]), torch.stack([w for _, w in pairs])


def each_matrix(x, w, dtype) -> torch.Tensor:
    """The oracle's rounding of each matrix's exact products."""
    return torch.stack([oracle_gemm(x[b], w[b], FORMATS[dtype]).to(dtype) for b in range(x.shape[0])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_matrix_has_the_exact_rounding(kind, dtype):
    x, w = batch_of(kind, 3, 5, 4, 37, dtype, seed=len(kind))
    found = det_gemm_batched(x, w, dtype)
    assert found.dtype == dtype and found.shape == (3, 5, 4)
    assert same_bits(found, each_matrix(x, w, dtype))


def test_ties_and_cancellation_reach_the_exact_accumulator():
    # 1 + 2**-24 is a tie in float32 (to 1), and x . w cancels to far below its terms
    x = torch.tensor([[1.0, 2.0**-24, 2.0**-24, -1.0, 2.0**-30], [1.0, 2.0**-24, 0.0, 0.0, 0.0]]).repeat(2, 1, 1)
    w = torch.ones((2, 3, 5))
    found = det_gemm_batched(x, w)
    assert same_bits(found, each_matrix(x, w, torch.float32))
    assert found[0, 0, 0] == 2.0**-23 + 2.0**-30 and found[1, 1, 2] == 1.0


def test_non_finite_operands_and_a_forced_implementation_give_the_same_bits():
    generator = torch.Generator().manual_seed(3)
    x, w = torch.randn((2, 3, 8), generator=generator), torch.randn((2, 4, 8), generator=generator)
    x[1, 2, 5], w[0, 1, 0] = float("inf"), float("nan")
    assert same_bits(det_gemm_batched(x, w), torch.stack([det_gemm(x[b], w[b]) for b in range(2)]))
    with implementations.forced("bins"):
        forced = det_gemm_batched(x[:, :, :4], w[:, :, :4])
    assert same_bits(forced, torch.stack([det_gemm(x[b, :, :4], w[b, :, :4]) for b in range(2)]))


@pytest.mark.parametrize("x_shape, w_shape", [((2, 3, 4), (3, 3, 4)), ((2, 3, 4), (2, 3, 5)), ((3, 4), (3, 4))])
def test_operands_that_are_not_a_batch_of_the_same_k_are_refused(x_shape, w_shape):
    with pytest.raises(ValueError, match="det_gemm_batched: x must be"):
        det_gemm_batched(torch.zeros(x_shape), torch.zeros(w_shape))
