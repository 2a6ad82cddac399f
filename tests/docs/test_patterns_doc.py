"""docs/cuda.md and docs/determinism.md quote the `patterns` lines and the device words of
cuDNN's pattern graphs; they must stay what a run prints and records."""

from __future__ import annotations

import sys

from docs_markdown import ROOT
from sexpgpu.backends.cuda import cudnn_engines
from sexpgpu.backends.cuda.patterns import PATTERN_NAMES, PatternsInEffect, PatternUse, decide_patterns, patterns_line
from sexpgpu.plan.device import patterns_text

CUDA = (ROOT / "docs" / "cuda.md").read_text()
DETERMINISM = (ROOT / "docs" / "determinism.md").read_text()


def quoted(line: str) -> str:
    return f"  {'patterns':<20}{line}"


def test_the_pages_quote_a_run_with_every_pattern_on():
    uses = [PatternUse("attention", f"attention {index}", True) for index in range(3)]
    uses += [PatternUse("products", f"product {index}", True) for index in range(6)]
    line = patterns_line(PatternsInEffect(PATTERN_NAMES), uses)
    assert quoted(line) in CUDA and quoted(line) in DETERMINISM


def test_the_page_quotes_the_lines_of_patterns_off(monkeypatch):
    assert quoted(patterns_line(decide_patterns("off", {}), ())) in CUDA
    monkeypatch.setattr(cudnn_engines, "_found", {})
    monkeypatch.setitem(sys.modules, "cudnn", None)  # `import cudnn` raises ImportError
    missing = dict.fromkeys(PATTERN_NAMES, cudnn_engines.unavailable())
    assert quoted(patterns_line(decide_patterns(None, missing), ())) in CUDA


def test_the_device_words_are_the_recorded_ones():
    for names in (PATTERN_NAMES, (), ("attention", "convolutions")):
        assert f"`patterns {patterns_text(names, PATTERN_NAMES)}`" in DETERMINISM
    declined = patterns_line(PatternsInEffect(("attention",)), [PatternUse("attention", "KEY", False, "WHY")])
    assert "N of M by cuDNN" + declined.split("0 of 1 by cuDNN")[1].split(";")[0] in CUDA.replace("\n", " ")
