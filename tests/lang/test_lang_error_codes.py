"""docs/errors.md lists every code the language raises, and every listed language code is
triggered by a malformed file or a test."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = re.compile(r"E-[A-Z]+-\d{3}")
LANGUAGE_SECTIONS = ("## Reading", "## Forms", "## Selecting a run")


def documented_rows(section_title: str) -> set[str]:
    text = (ROOT / "docs" / "errors.md").read_text()
    section = text.split(section_title + "\n", 1)[1].split("\n## ", 1)[0]
    return {match.group(0) for line in section.splitlines() if line.startswith("| E-")
            for match in [CODE.match(line[2:])]}


def raised_by_the_language() -> set[str]:
    codes = set()
    for path in (ROOT / "src" / "sexpgpu" / "lang").glob("*.py"):
        codes.update(CODE.findall(path.read_text()))
    return codes


def test_every_code_the_language_raises_is_documented():
    documented = set().union(*(documented_rows(title) for title in LANGUAGE_SECTIONS))
    assert raised_by_the_language() <= documented
    assert documented <= raised_by_the_language(), "a documented code no longer raised"


def test_every_documented_language_code_is_triggered_by_a_file_or_a_test():
    malformed = ROOT / "tests" / "malformed"
    expected = {CODE.search(path.read_bytes().split(b"\n", 1)[0].decode()).group(0)
                for path in malformed.glob("*.sexp")}
    tests_text = "".join(path.read_text() for path in (ROOT / "tests" / "lang").glob("test_*.py"))
    for title in LANGUAGE_SECTIONS:
        for code in documented_rows(title):
            assert code in expected or f'"{code}"' in tests_text, code
