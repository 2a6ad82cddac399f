"""The fused attention kernels (backends/cuda/codegen/attention.py) under Triton's
interpreter against the CPU interpreter: forward and both cotangents, causal or not, float32
and bf16, lengths that leave partial blocks, one query, different q and k lengths, and a
head wider than the fused kernels take (attention_wide.py); two runs give the same bits.
tests/cuda/test_attention_gpu.py repeats these on the GPU with its own tiles."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs tests/cuda/test_attention_gpu.py instead
    pytest.skip("a GPU is present: the GPU test checks these kernels there", allow_module_level=True)
pytest.importorskip("triton")

from attention_checks import check  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py

CASES = [
    ([(2, 3, 19, 4)] * 3, "f32", True),
    ([(2, 7, 4), (2, 33, 4), (2, 33, 5)], "f32", False),
    ([(2, 2, 21, 8)] * 3, "bf16", True),
    ([(1, 17, 4), (1, 9, 4), (1, 9, 6)], "bf16", False),
    ([(1, 1, 1, 4)] * 3, "f32", True),
    ([(3, 5, 6)] * 3, "f32", True),
    ([(1, 5, 130), (1, 6, 130), (1, 6, 3)], "f32", False),
    ([(1, 6, 130)] * 3, "bf16", True),
]


@pytest.fixture(scope="module")
def backend():
    return CudaBackend(device="cpu")


@pytest.mark.parametrize("shapes,dtype,causal", CASES, ids=lambda value: str(value).replace(" ", ""))
def test_fused_attention_matches_the_interpreter_and_repeats_its_bits(backend, shapes, dtype, causal):
    check(backend, shapes, dtype, causal)
