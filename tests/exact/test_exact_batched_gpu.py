"""CUDA: det_gemm_batched (batched.py) gives each matrix det_gemm's bits on the device, where its
pair sums and its last outputs run the Triton kernels, on random and adversarial batches in
float32 and bfloat16, and matches the same call on the CPU.

    PYTHONPATH=src python -m pytest tests/exact/test_exact_batched_gpu.py -m gpu -n 0
"""

import pytest
import torch

from adversarial import KINDS
from exact_oracle import same_bits
from sexpgpu.exact import det_finalize, det_gemm_batched, det_gemm_partial

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_matrix_has_det_gemms_bits_on_the_device(kind, dtype):
    generator = torch.Generator().manual_seed(len(kind))
    pairs = [KINDS[kind](64, 48, 96, dtype, generator) for _ in range(6)]
    x, w = torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])
    found = det_gemm_batched(x.cuda(), w.cuda(), dtype).cpu()
    each = torch.stack([det_finalize(det_gemm_partial(x[b].cuda(), w[b].cuda()), dtype).cpu() for b in range(6)])
    assert same_bits(found, each)
    assert same_bits(found, det_gemm_batched(x, w, dtype))
