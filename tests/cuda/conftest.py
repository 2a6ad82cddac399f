"""Fixtures of the CUDA backend's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def interpreted(monkeypatch):
    """Triton's interpreter for a test that asks for it (the `*_interpret.py` modules mark
    all their tests so), and only for that test: Triton reads the variable at each launch and
    decoration, so the rest of a session compiles as usual."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
