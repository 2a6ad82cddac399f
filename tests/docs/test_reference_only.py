"""docs/ says what is true now: no page keeps a dated log (history is CHANGELOG.md's, and
measurements are the benchmarks' own output), the largest reference pages stay readable as
reference, every link of a page leads to a file that is there, and every citation of a page's
section (`docs/cuda.md, "Attention"` in a comment, a docstring or a page) names a heading or
a paragraph's bold title of that page. A generated report is
linked, not pasted: the ladder's committed reports lie in bench/results/ladder/<machine>/ with their
plots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from docs_markdown import ROOT, code_blocks, shown

PAGES = sorted((ROOT / "docs").glob("*.md"))
REPORTS = sorted((ROOT / "bench" / "results" / "ladder").glob("*/report.md"))  # generated: they carry their date

# What a run log writes and a reference page does not: a date, and the words of a diary.
DIARY = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a session": re.compile(r"\b(a new|this|that|the first|the second|first|second|third|later|earlier|one) session\b",
                            re.IGNORECASE),
    "'later on'": re.compile(r"\blater on\b", re.IGNORECASE),
    "'later the same day'": re.compile(r"\blater the same (day|morning)|\bthe same morning\b", re.IGNORECASE),
    "'not landed'": re.compile(r"\bnot landed\b", re.IGNORECASE),
    "'we measured'": re.compile(r"\bwe measured\b", re.IGNORECASE),
}
LARGEST_BYTES = {"cuda.md": 40 * 1024, "exact.md": 40 * 1024}  # 40 KB: a page of reference, not a log
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)]*)?\)")
CITATION = re.compile(r'\b([\w-]+\.md),? \\?"([^"\\]+)\\?"')  # page.md, "Section" (also \"Section\" in a string)
CITING = ["src/**/*.py", "tests/**/*.py", "bench/*.py", "docs/*.md", "README.md"]


def prose(document: Path) -> str:
    """The page without its fenced code blocks (commands and output may hold a date)."""
    text = document.read_text()
    for block in code_blocks(document):
        text = text.replace(block.text, "")
    return text


def diary_lines(document: Path) -> list[str]:
    return [f"{shown(document)}: {name}: {line.strip()[:100]}"
            for line in prose(document).splitlines() for name, pattern in DIARY.items() if pattern.search(line)]


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_no_page_keeps_a_dated_log(page):
    found = diary_lines(page)
    assert not found, "history goes to CHANGELOG.md, measurements to bench/:\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted(LARGEST_BYTES))
def test_the_largest_reference_pages_stay_under_their_size(name):
    size = len((ROOT / "docs" / name).read_bytes())
    assert size < LARGEST_BYTES[name], f"docs/{name} is {size} bytes: move detail to a page of its own, not a log"


@pytest.mark.parametrize("page", PAGES + REPORTS, ids=shown)
def test_every_link_leads_to_a_file_that_is_there(page):
    targets = [match.group(1) for match in LINK.finditer(prose(page)) if "://" not in match.group(1)]
    missing = [target for target in targets if not (page.parent / target).exists()]
    assert not missing, f"{shown(page)} links to files that are not there: {missing}"


def titles(page: Path) -> set[str]:
    """A page's section names: its headings, and the bold words that open a paragraph or a bullet."""
    text = page.read_text()
    found = re.findall(r"^#+ (.+)$", text, re.MULTILINE) + re.findall(r"^(?:- )?\*\*([^*]+)\*\*", text, re.MULTILINE)
    return {normalised(title).rstrip(".") for title in found}


def normalised(title: str) -> str:
    return re.sub(r"\s*\n\s*#?\s*", " ", title).strip().lower()  # a citation may wrap, in a comment too


def broken_citations(sources: list[Path], pages: list[Path]) -> list[str]:
    sections = {page.name: titles(page) for page in pages}
    return [f"{shown(source)} cites {match.group(1)}, {match.group(2)!r}"
            for source in sources for match in CITATION.finditer(source.read_text())
            if match.group(1) in sections
            and not any(found.startswith(normalised(match.group(2))) for found in sections[match.group(1)])]


def test_every_cited_section_is_there():
    sources = sorted({path for pattern in CITING for path in ROOT.glob(pattern)})
    broken = broken_citations(sources, PAGES)
    assert not broken, "rename the citation or the section:\n" + "\n".join(broken)


def test_the_checker_finds_a_citation_of_a_section_that_is_gone(tmp_path):
    (tmp_path / "page.md").write_text("# Page\n\n## Kernels\n\n- **Row kernels merge** when ...\n")
    source = tmp_path / "code.py"
    source.write_text('# docs/page.md, "Kernels"; (page.md, "Row kernels\n# merge"); docs/page.md, "Speed"\n')
    assert broken_citations([source], [tmp_path / "page.md"]) == [f"{source} cites page.md, 'Speed'"]


def test_the_ladder_page_links_its_generated_reports_with_their_plots():
    page = ROOT / "docs" / "ladder.md"
    linked = {(page.parent / match.group(1)).resolve() for match in LINK.finditer(prose(page))}
    assert set(REPORTS) <= linked and len(REPORTS) >= 2
    for report in REPORTS:
        plots = [match.group(1) for match in LINK.finditer(report.read_text()) if match.group(1).endswith(".png")]
        assert plots and all((report.parent / plot).is_file() for plot in plots), shown(report)
    assert not re.search(r"^#+ .*report on", page.read_text(), re.MULTILINE | re.IGNORECASE), "a pasted report"


def test_the_checker_finds_a_dated_log(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\nLater on 2026-12-02 (a new session) the sweep was not landed.\n\n"
                    "```\nsexpgpu ladder ... 2026-12-02 00:20 UTC\n```\n")
    assert [line.split(": ")[1] for line in diary_lines(page)] == ["a date", "a session", "'later on'", "'not landed'"]
