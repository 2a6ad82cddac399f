"""Test groups: no device (the default), and `gpu`, which needs an NVIDIA GPU and is
skipped cleanly when none is present (CI has none; the device machine runs them)."""

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none is present)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
