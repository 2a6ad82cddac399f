"""The fused attention kernels on a GPU against the CPU interpreter, within the envelope of
tests/cuda/attention_checks.py, each run twice for the same bits: the GPU's own tiles
(64 to 128 queries, 32 to 64 keys), lengths that leave partial tiles, heads of 64 and 128,
a narrow head, one wider than the fused kernels take, and gpt-50m's head at its context.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_attention_gpu.py -m gpu
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from attention_checks import check  # noqa: E402

CASES = [
    ([(2, 8, 512, 64)] * 3, "f32", True),
    ([(2, 8, 512, 64)] * 3, "bf16", True),
    ([(2, 3, 257, 64)] * 3, "f32", False),
    ([(2, 3, 257, 64)] * 3, "bf16", False),
    ([(1, 2, 193, 128)] * 3, "f32", True),
    ([(1, 2, 193, 128)] * 3, "bf16", True),
    ([(3, 100, 20), (3, 77, 20), (3, 77, 36)], "f32", False),
    ([(3, 100, 20), (3, 77, 20), (3, 77, 36)], "bf16", False),
    ([(1, 1, 1, 64)] * 3, "bf16", True),
    ([(1, 2, 70, 160)] * 3, "f32", True),
]


@pytest.fixture(scope="module")
def backend():
    """The backend's own kernels: a policy given has no pattern graphs (cuDNN's attention is
    tests/cuda/test_patterns_gpu.py's)."""
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.cuda.fusion import policy_from_environment

    return CudaBackend(policy=policy_from_environment())


@pytest.mark.parametrize("shapes,dtype,causal", CASES, ids=lambda value: str(value).replace(" ", ""))
def test_fused_attention_on_the_gpu_matches_the_interpreter_and_repeats_its_bits(backend, shapes, dtype, causal):
    check(backend, shapes, dtype, causal)
