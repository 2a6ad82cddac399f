"""CUDA: the queued path compiled (queued.py, queued_kernels.py), against the host path on the CPU,
and with no synchronisation at all (torch.cuda.set_sync_debug_mode("error") turns one into an
error). tests/exact/test_exact_queued_interpret.py runs the same kernels under Triton's
interpreter, stage by stage, against the Fraction oracle.

    PYTHONPATH=src python -m pytest tests/exact/test_exact_queued_gpu.py -m gpu -n 0
"""

import pytest
import torch

from adversarial import KINDS
from exact_oracle import same_bits
from sexpgpu.exact import det_gemm, det_gemm_batched, det_scatter_sum, det_scatter_sum_partial, det_sum

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_products_sums_and_batches_have_the_cpus_bits(kind, dtype):
    generator = torch.Generator().manual_seed(len(kind))
    x, w = KINDS[kind](96, 80, 300, dtype, generator)
    assert same_bits(det_gemm(x.cuda(), w.cuda(), non_blocking=True).cpu(), det_gemm(x, w))
    assert same_bits(det_gemm(x.cuda(), w.cuda().T.contiguous().T, non_blocking=True).cpu(), det_gemm(x, w))
    assert same_bits(det_sum(x.cuda(), 1, dtype=torch.float32).cpu(), det_sum(x, 1, dtype=torch.float32))
    assert same_bits(det_sum(x.cuda(), 0, dtype=torch.float32).cpu(), det_sum(x, 0, dtype=torch.float32))
    xs, ws = torch.stack([x, x.flip(0)]), torch.stack([w, -w])
    assert same_bits(det_gemm_batched(xs.cuda(), ws.cuda()).cpu(), det_gemm_batched(xs, ws))


def test_special_values_ties_and_a_long_sum():
    generator = torch.Generator().manual_seed(4)
    x, w = torch.randn((40, 70), generator=generator), torch.randn((50, 70), generator=generator)
    x[1, 3], x[3, 2], w[2, 0], w[4, 2], w[5, 7] = float("inf"), float("-inf"), float("nan"), 0.0, float("inf")
    x[7, :2], w[9, :2], x[7, 2:], w[9, 2:] = torch.tensor([1.0, 2.0**-24]), 1.0, 0.0, 0.0  # a tie
    assert same_bits(det_gemm(x.cuda(), w.cuda(), non_blocking=True).cpu(), det_gemm(x, w))
    assert same_bits(det_sum(x.cuda(), 1).cpu(), det_sum(x, 1))
    long = torch.randn(3 * (1 << 16) + 5, generator=generator) ** 2  # segments
    assert same_bits(det_sum(long.cuda(), 0).cpu(), det_sum(long, 0))


def test_scatter_sums_have_the_cpus_digits_and_bits():
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 50, (8, 33), generator=generator)
    ids[0] = 7  # one id many times
    values = torch.randn((8, 33, 130), generator=generator) * 2.0 ** torch.randint(-60, 60, (8, 33, 130))
    values[1, 2, 3] = float("nan")
    want = det_scatter_sum_partial(ids, values, 50)
    assert torch.equal(det_scatter_sum_partial(ids.cuda(), values.cuda(), 50).digits.cpu(), want.digits)
    assert same_bits(det_scatter_sum(ids.cuda(), values.cuda(), 50).cpu(), det_scatter_sum(ids, values, 50))


def test_no_queued_call_synchronises():
    generator = torch.Generator().manual_seed(8)
    x, w = torch.randn((300, 500), generator=generator).cuda(), torch.randn((200, 500), generator=generator).cuda()
    ids = torch.randint(0, 40, (300,), generator=generator).cuda()
    calls = [lambda: det_gemm(x, w, non_blocking=True), lambda: det_gemm_batched(x[None], w[None]),
             lambda: det_sum(x, 1), lambda: det_sum(x, 0), lambda: det_scatter_sum(ids, x, 40)]
    for call in calls:
        call()  # compiled before the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
