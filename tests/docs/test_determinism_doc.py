"""docs/determinism.md quotes the determinism lines the backends state; they must stay the
lines a run prints."""

from __future__ import annotations

import inspect

from docs_markdown import ROOT
from sexpgpu.backends.select import cpu_facts

PAGE = (ROOT / "docs" / "determinism.md").read_text()


def test_the_page_quotes_the_cpu_interpreters_lines():
    facts = cpu_facts()
    for name in ("determinism", "choices"):
        assert f"{name:<20}{facts[name]}" in PAGE, name


def test_the_page_quotes_the_cuda_backends_determinism_line():
    # Read from the source: building the CUDA facts needs a GPU.
    from sexpgpu.backends.cuda import device

    source = inspect.getsource(device.facts)
    line = "".join(part for part in source.split('"determinism": (')[1].split(")")[0].split('"')[1::2])
    assert line.startswith("1: ") and f"{'determinism':<20}{line}" in PAGE


def test_the_pages_that_cite_it_find_it():
    for page in ("errors.md", "checkpoints.md"):
        assert "docs/determinism.md" in (ROOT / "docs" / page).read_text()
    assert "## Random draws" in PAGE  # checkpoints.md cites this section by name
