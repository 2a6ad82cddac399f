"""Fixtures for the exact library's tests."""

import pytest

from exact_random import CPU_IMPLEMENTATIONS
from sexpgpu.exact import backends


@pytest.fixture(params=CPU_IMPLEMENTATIONS)
def implementation(request):
    """Run the test once with each CPU implementation of the kernel boundary."""
    with backends.forced(request.param):
        yield request.param
