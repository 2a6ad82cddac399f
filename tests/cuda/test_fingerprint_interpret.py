"""The CUDA backend's fingerprint kernel, run by Triton's interpreter on the CPU, gives the
CPU definition's fingerprints (tests/cuda/test_cuda_gpu.py repeats this on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sexpgpu.backends.cpu.fingerprint import fingerprint  # noqa: E402
from sexpgpu.backends.cuda.fingerprint import BLOCK, fingerprints  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py




def test_the_kernel_gives_the_cpu_fingerprints():
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in [(3,), (2 * BLOCK + 7,), (5, 4)]]
    arrays.append(np.array([np.nan, -0.0, np.inf], dtype=np.float32))
    ours = fingerprints([torch.from_numpy(array) for array in arrays])
    assert ours == [fingerprint(array) for array in arrays]


def test_a_bf16_tensor_is_fingerprinted_as_its_float32_values():
    values = torch.tensor([1.5, -2.0, 3.0e-3], dtype=torch.bfloat16)
    assert fingerprints([values]) == [fingerprint(values.float().numpy())]
