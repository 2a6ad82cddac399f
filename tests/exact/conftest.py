"""Fixtures for the exact library's tests."""

import pytest

from sexpgpu.exact import backends

CPU_IMPLEMENTATIONS = ["bins", "sliced"]


@pytest.fixture(params=CPU_IMPLEMENTATIONS)
def implementation(request):
    """Run the test once with each CPU implementation of the kernel boundary."""
    with backends.forced(request.param):
        yield request.param
