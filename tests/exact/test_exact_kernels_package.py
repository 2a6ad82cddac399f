"""The kernel directory loads through Hugging Face `kernels`, offline, as the same library."""

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before kernels (and huggingface_hub) are imported
kernels = pytest.importorskip("kernels")
if not hasattr(kernels, "get_local_kernel"):
    # Without the package installed, `import kernels` from the repository's root finds the
    # kernels/ folder as a namespace package.
    pytest.skip("Hugging Face kernels (with get_local_kernel) is not installed", allow_module_level=True)

import sexpgpu.exact as exact  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIR = ROOT / "hub" / "det-train"


@pytest.fixture(scope="module")
def dt():
    return kernels.get_local_kernel(KERNEL_DIR)


def test_the_loaded_kernel_is_sexpgpu_exact_itself(dt):
    assert set(exact.__all__) <= set(dir(dt))
    # One implementation: the variant's package is a link to the source, not a copy.
    assert Path(dt.__file__).resolve() == Path(exact.__file__).resolve()


def test_the_loaded_kernel_computes_the_same_bits(dt):
    generator = torch.Generator().manual_seed(41)
    x, w = torch.randn(6, 50, generator=generator), torch.randn(4, 50, generator=generator)
    a1 = dt.det_gemm_partial(x[:, :20], w[:, :20])
    a2 = dt.det_gemm_partial(x[:, 20:], w[:, 20:])
    assert torch.equal(dt.det_finalize(dt.det_combine([a1, a2])), exact.det_gemm(x, w))
    layer = dt.DetLinear(50, 4)
    layer(x).square().mean().backward()
    assert layer.weight.grad.shape == (4, 50)


def test_the_spec_s_get_kernel_call_resolves_here_through_local_kernels(monkeypatch):
    monkeypatch.setenv("LOCAL_KERNELS", f"phanerozoic/det-train={KERNEL_DIR}")
    dt = kernels.get_kernel("phanerozoic/det-train", version=1, trust_remote_code=True)
    assert Path(dt.__file__).resolve() == Path(exact.__file__).resolve()


@pytest.mark.parametrize("variant", ["torch-cpu", "torch-cuda"])
def test_every_variant_has_valid_metadata_and_the_package(variant):
    from kernels._rust import Metadata

    metadata = Metadata.read_from_file(KERNEL_DIR / "build" / variant / "metadata.json")
    assert str(metadata.name) == "det-train" and metadata.version == 1
    assert (KERNEL_DIR / "build" / variant / "det_train" / "__init__.py").resolve() == Path(exact.__file__).resolve()
