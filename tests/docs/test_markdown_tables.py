"""Every markdown table of README.md and docs/ renders as one table: a header, a separator
row, then rows with as many cells as the header. A blank line inside a table would end it
there and show the rest as plain text with pipes."""

from __future__ import annotations

import pytest

from docs_markdown import DOCUMENTS, TableRun, cells, is_separator, shown, table_runs


def table_problems(run: TableRun) -> list[str]:
    where = f"{shown(run.document)}:{run.line}"
    if len(run.rows) < 2 or not is_separator(run.rows[1]):
        return [f"{where}: rows without a header and separator row (a table split by a blank line?)"]
    width = len(cells(run.rows[0]))
    return [f"{where}: row {offset + 1} has {len(cells(row))} cells, the header {width}"
            for offset, row in enumerate(run.rows) if len(cells(row)) != width]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_table_is_whole_and_rectangular(document):
    problems = [problem for run in table_runs(document) for problem in table_problems(run)]
    assert not problems, "\n".join(problems)


def test_the_checker_finds_a_split_table_and_a_short_row(tmp_path):
    document = tmp_path / "sample.md"
    document.write_text("| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n\n| a | b |\n|---|---|\n| 1 |\n")
    problems = [problem for run in table_runs(document) for problem in table_problems(run)]
    assert len(problems) == 2 and "split" in problems[0] and "has 1 cells" in problems[1]
