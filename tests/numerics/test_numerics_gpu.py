"""GPU tests (marked gpu; skipped without CUDA): the exhaustive check of every float32
input, and CPU/GPU bit identity of draws, pow, Philox and initializers. The checks live in
gpu_checks.py, which a GPU run can also execute directly (PYTHONPATH=src python
tests/numerics/gpu_checks.py REPORT.json). The last tests run the same checking code on
the CPU over a slice, so that its logic is exercised (and seen to fail) everywhere."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gpu_checks  # noqa: E402
from sexpgpu import numerics as nx  # noqa: E402

gpu = pytest.mark.gpu
no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def record(report):
    """Append a check's counts to the JSON-lines file named by SEXPGPU_NUMERICS_REPORT."""
    path = os.environ.get("SEXPGPU_NUMERICS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(report) + "\n")
    return report


@gpu
@no_cuda
@pytest.mark.parametrize("name", sorted(gpu_checks.REFERENCES))
def test_every_float32_input_is_correctly_rounded(name):
    report = record(gpu_checks.exhaustive(name))
    assert report["checked"] == 2**32
    assert report["mismatches"] == []
    assert report["unsure_cpu_equal"] == report["unsure"]
    assert report["unsure_mpmath_equal"] in (None, report["unsure"])


@gpu
@no_cuda
@pytest.mark.parametrize("name", sorted(gpu_checks.DISTRIBUTIONS))
def test_draws_are_the_cpu_bits(name):
    report = record(gpu_checks.draws_identity(name))
    assert report["elements"] >= 10**8
    assert report["differing_streams"] == []


@gpu
@no_cuda
def test_pow_and_philox_are_the_cpu_bits():
    assert record(gpu_checks.pow_identity())["differing"] == 0
    assert record(gpu_checks.philox_identity())["differing"] == 0


@gpu
@no_cuda
@pytest.mark.parametrize("name", sorted(nx.INITIALIZERS))
def test_initializers_are_the_cpu_bits(name):
    key = nx.stream_key(5, f"layer/{name}")
    for shape in [(64, 32), (16, 8, 3, 3), (1000,)]:
        gpu = nx.initialize(name, key, shape, device="cuda")
        assert gpu.device.type == "cuda" and gpu.dtype == torch.float32
        assert np.array_equal(gpu.cpu().numpy(), nx.initialize(name, key, shape))


@gpu
@no_cuda
def test_cuda_tensors_keep_shape_and_reject_other_dtypes():
    x = torch.linspace(-3, 3, 600, device="cuda").reshape(20, 30)
    strided = x.t()
    got = nx.tanh(strided)
    assert got.shape == strided.shape and got.is_cuda
    assert np.array_equal(got.cpu().numpy(), nx.tanh(strided.cpu().numpy()))
    with pytest.raises(TypeError, match="float32"):
        nx.exp(x.double())
    with pytest.raises(TypeError, match="same kind"):
        nx.pow(x, torch.ones(20, 30))


def test_checking_code_on_a_cpu_slice():
    for name in gpu_checks.REFERENCES:
        report = gpu_checks.exhaustive(name, device="cpu", chunk=1 << 16, start=0x3F7F0000,
                                       stop=0x3F810000)
        assert report["checked"] == 1 << 17 and report["mismatches"] == []
        assert report["unsure_cpu_equal"] == report["unsure"]


def test_checking_code_reports_a_wrong_function(monkeypatch):
    monkeypatch.setitem(gpu_checks.REFERENCES, "exp", torch.expm1)
    report = gpu_checks.exhaustive("exp", device="cpu", chunk=1 << 12, start=0x3F000000,
                                   stop=0x3F001000)
    assert len(report["mismatches"]) == 20
