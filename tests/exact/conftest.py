"""Fixtures for the exact library's tests."""

import pytest

from exact_random import CPU_IMPLEMENTATIONS
from sexpgpu.exact import implementations


@pytest.fixture(params=CPU_IMPLEMENTATIONS)
def implementation(request):
    """Run the test once with each CPU implementation of the kernel boundary."""
    with implementations.forced(request.param):
        yield request.param


@pytest.fixture
def interpreted_device_paths(monkeypatch):
    """Triton's interpreter, and CPU tensors on the paths CUDA tensors take (implementations.device_paths)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with implementations.device_paths():
        yield
