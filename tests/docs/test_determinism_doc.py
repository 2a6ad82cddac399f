"""docs/determinism.md quotes the determinism lines the backends state; they must stay the
lines a run prints."""

from __future__ import annotations

from docs_markdown import ROOT
from sexpgpu.backends.cpu.facts import cpu_facts
from sexpgpu.backends.select import run_facts
from sexpgpu.plan.levels import How, determinism_line

PAGE = (ROOT / "docs" / "determinism.md").read_text()


def test_the_page_quotes_the_cpu_interpreters_lines():
    facts = cpu_facts()
    for name in ("determinism", "choices"):
        assert f"{name:<20}{facts[name]}" in PAGE, name


def test_the_page_quotes_the_level_1_line_of_a_device_run():
    # the line a CUDA run that chose for itself prints, and the CUDA backend's own report
    line = determinism_line(How("own"), "compute_90 with 132 multiprocessors")
    assert line.startswith("1: ") and f"{'determinism':<20}{line}" in PAGE


def test_the_page_quotes_the_level_line_of_a_run_that_remembers_nothing():
    line = determinism_line(How("own", forgets="REASON"), "compute_90 with 132 multiprocessors")
    row = next(row for row in PAGE.splitlines() if row.startswith("| the run's own, with HOME unset"))
    quoted = row.split("`")[1]
    assert quoted.endswith("; ...") and line.startswith(quoted.removesuffix("; ...")), (quoted, line)


def test_the_pages_that_cite_it_find_it():
    for page in ("errors.md", "checkpoints.md"):
        assert "docs/determinism.md" in (ROOT / "docs" / page).read_text()
    assert "## Random draws" in PAGE  # checkpoints.md cites this section by name


def test_the_page_quotes_the_lines_of_an_exact_run():
    facts = run_facts(cpu_facts(), "exact")
    for name in ("determinism", "choices"):
        assert f"{name:<20}{facts[name]}" in PAGE, name
    assert determinism_line(How("exact"), "").startswith("exact on every device: ")


def test_an_exact_run_on_the_gpu_states_the_lines_the_page_quotes():
    from sexpgpu.backends.select import EXACT_FACTS

    for name in ("determinism", "choices"):
        assert f"{name:<20}{EXACT_FACTS[name]}" in PAGE, name
