"""Test groups: no device (the default), and `gpu`, which needs an NVIDIA GPU and is
skipped cleanly when none is present (CI has none; the device machine runs them)."""

import inspect
import sys
import textwrap
from pathlib import Path

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config):
    _device_functions_called_without_repatching()


def _device_functions_called_without_repatching():
    """Under Triton's interpreter a launch patches triton.language for its grid and restores it
    after; each call of a @triton.jit device function inside the grid patches it again (the
    same values: a nested scope that is never restored), which took most of the time of the
    kernels that call helpers per element (the Kulisch digits: ~1.6 ms a call). Our kernels'
    modules import triton.language only as `tl`, which the launch has patched already, so the
    calls skip the repeat: every value is the same. Skipped unless the method is, to the letter,
    the one this replaces (another Triton keeps its own)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    function = getattr(interpreter, "InterpretedFunction", None)
    if function is None or _source(function.__call__) != _REPATCHING_CALL:
        return

    def call(self, *args, **kwargs):  # InterpretedFunction.__call__ less its _patch_lang
        try:
            return self.rewrite()(*args, **kwargs)
        except Exception as error:
            raise interpreter.InterpreterError(repr(error)) from error

    function.__call__ = call


_REPATCHING_CALL = """def __call__(self, *args, **kwargs):
    # This is a device function call
    _patch_lang(self.fn)
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise InterpreterError(repr(e)) from e"""


def _source(method) -> str:
    try:
        return textwrap.dedent(inspect.getsource(method)).strip()
    except (OSError, TypeError):
        return ""


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
