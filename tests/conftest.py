"""Test groups: no device (the default), and `gpu`, which needs an NVIDIA GPU and is
skipped cleanly when none is present (CI has none; the device machine runs them)."""

import sys
from pathlib import Path

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    # Long tests first, so that no worker of pytest-xdist starts one when the others are done.
    items.sort(key=lambda item: "slow" not in item.keywords)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none is present)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """The fuzzer's figures (tests/fuzz), summed over its shards, whichever worker ran them."""
    records = [value for reports in terminalreporter.stats.values() for report in reports
               if getattr(report, "when", None) == "call"
               for name, value in getattr(report, "user_properties", ()) if name == "fuzz-summary"]
    if records:
        sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
        from fuzz_harness import Summary

        terminalreporter.write_sep("-", "fuzzer figures (times summed over the shards)")
        terminalreporter.write_line(Summary.from_records(records).format())
