"""The parts of README.md and docs/*.md that tests check: tables and fenced code blocks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
SEPARATOR_CELL = re.compile(r"^\s*:?-{3,}:?\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language tag, its text, and where it starts."""

    document: Path
    line: int  # of the opening fence, counting from 1
    language: str
    text: str

    def __str__(self) -> str:
        return f"{shown(self.document)}:{self.line}"


@dataclass(frozen=True)
class TableRun:
    """Consecutive lines that start and end with '|' (table rows), outside code blocks."""

    document: Path
    line: int
    rows: list[str]


def code_blocks(document: Path) -> list[Block]:
    blocks, opened, body = [], None, []
    for number, line in enumerate(document.read_text().splitlines(), 1):
        match = FENCE.match(line.strip())
        if opened is None and match:
            opened, body = (number, match.group(1), match.group(2)), []
        elif opened is not None and line.strip() == opened[1]:
            blocks.append(Block(document, opened[0], opened[2], "\n".join(body) + "\n"))
            opened = None
        elif opened is not None:
            body.append(line)
    return blocks


def table_runs(document: Path) -> list[TableRun]:
    runs, current, in_code = [], None, None
    for number, line in enumerate(document.read_text().splitlines(), 1):
        match = FENCE.match(line.strip())
        if match and in_code is None:
            in_code = match.group(1)
        elif in_code is not None and line.strip() == in_code:
            in_code = None
        elif in_code is None and line.strip().startswith("|") and line.strip().endswith("|"):
            if current is None:
                current = TableRun(document, number, [])
                runs.append(current)
            current.rows.append(line.strip())
            continue
        current = None
    return runs


def cells(row: str) -> list[str]:
    """A row's cells: split at each '|' that is not escaped as '\\|', code spans included, as
    GitHub's tables do."""
    parts = re.split(r"(?<!\\)\|", row.strip())
    return parts[1:-1] if row.strip().endswith("|") else parts[1:]


def is_separator(row: str) -> bool:
    return all(SEPARATOR_CELL.match(cell) for cell in cells(row)) and bool(cells(row))


def shown(document: Path) -> str:
    return str(document.relative_to(ROOT)) if document.is_relative_to(ROOT) else str(document)
