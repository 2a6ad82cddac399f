"""Text to syntax. Reading never executes anything.

Grammar (docs/language.md has the whole language):

    file    := datum*
    datum   := list | atom
    list    := '(' datum* ')'
    atom    := integer | float | string | keyword | symbol
    comment := ';' to end of line

Numbers: `12`, `-3`, `+7`, `1_000`, `0.5`, `-0.5`, `1e-3`, `2.5E+4`. `inf`, `+inf`, `-inf` and
`nan` are symbols; the forms that accept them say so. Strings take the escapes
\\n \\t \\r \\0 \\\\ \\" . Lines and columns count characters from 1; a tab is one column.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import NamedTuple

from sexpgpu.errors import Location, SexpgpuError
from sexpgpu.lang.syntax import Float, Integer, Keyword, SList, String, Symbol

_DELIMITERS = set("()\";") | set(" \t\r\n\f\v")
_INTEGER = re.compile(r"[+-]?[0-9](_?[0-9])*\Z")
_FLOAT = re.compile(r"[+-]?([0-9](_?[0-9])*\.[0-9]*|\.[0-9]+|[0-9](_?[0-9])*)([eE][+-]?[0-9]+)?\Z")
_LOOKS_NUMERIC = re.compile(r"[+-]?\.?[0-9]")
_SYMBOL = re.compile(r"[A-Za-z_*+\-/<>=!?&%.$^~][A-Za-z0-9_*+\-/<>=!?&%.$^~:']*\Z")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "r": "\r", "0": "\0"}
_BYTE_ORDER_MARK = "\ufeff"
EXACT_DIGITS = 1000  # far past every integer range of the language (the largest is 2^64-1)


def read_text(text: str, file: str = "<string>") -> list:
    """Every datum in `text`, in order."""
    if text.startswith(_BYTE_ORDER_MARK):
        text = text[1:]
    return _Reader(text, file).read_all()


def read_source(path: str) -> tuple[str, str]:
    """The text of the file at `path` and the SHA-256 (hex) of its bytes."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise SexpgpuError("E-FILE-001", f"no experiment file at '{path}'.") from None
    except IsADirectoryError:
        raise SexpgpuError("E-FILE-001", f"'{path}' is a directory, not an experiment file.") from None
    except OSError as error:
        raise SexpgpuError("E-FILE-001", f"cannot read '{path}': {error.strerror}.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SexpgpuError(
            "E-READ-006",
            f"the file is not UTF-8 text: byte {error.start} (0x{raw[error.start]:02x}) does not decode.",
            _location_of_byte(raw, error.start, path),
        ) from None
    return text, hashlib.sha256(raw).hexdigest()


def _location_of_byte(raw: bytes, offset: int, path: str) -> Location:
    before = raw[:offset].decode("utf-8", errors="replace")
    line = before.count("\n") + 1
    return Location(path, line, len(before) - (before.rfind("\n") + 1) + 1)


class _OpenList(NamedTuple):
    start: Location
    items: list


class _Reader:
    def __init__(self, text: str, file: str):
        self.text = text
        self.file = file
        self.pos = 0
        self.line = 1
        self.column = 1

    def here(self) -> Location:
        return Location(self.file, self.line, self.column)

    def advance(self) -> None:
        if self.text[self.pos] == "\n":
            self.line += 1
            self.column = 1
        else:
            self.column += 1
        self.pos += 1

    def skip_space_and_comments(self) -> None:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == ";":
                while self.pos < len(self.text) and self.text[self.pos] != "\n":
                    self.advance()
            elif char in _DELIMITERS and char not in "()\"":
                self.advance()
            else:
                return

    def read_all(self) -> list:
        data = []
        while True:
            self.skip_space_and_comments()
            if self.pos >= len(self.text):
                return data
            if self.text[self.pos] == ")":
                raise SexpgpuError("E-READ-002", "unexpected ')': there is no open '(' for it to close.", self.here())
            data.append(self.read_datum())

    def read_datum(self):
        """One datum. Lists are read with an explicit stack of the lists still open, so that
        nesting is limited by memory only, never by Python's recursion limit."""
        open_lists: list[_OpenList] = []
        while True:
            char = self.text[self.pos]
            if char == "(":
                open_lists.append(_OpenList(self.here(), []))
                self.advance()
            else:
                value = self.read_string() if char == '"' else self.read_atom()
                if not open_lists:
                    return value
                open_lists[-1].items.append(value)
            while True:
                self.skip_space_and_comments()
                innermost = open_lists[-1]
                if self.pos >= len(self.text):
                    raise SexpgpuError(
                        "E-READ-001",
                        "the '(' opened here is never closed: expected ')' before the end of the file.",
                        innermost.start,
                        _missing_paren_hint(self.text, innermost.start),
                    )
                if self.text[self.pos] != ")":
                    break
                end = self.here()
                self.advance()
                closed = SList(tuple(innermost.items), innermost.start, end)
                open_lists.pop()
                if not open_lists:
                    return closed
                open_lists[-1].items.append(closed)

    def read_string(self) -> String:
        start = self.here()
        self.advance()
        chars = []
        while True:
            if self.pos >= len(self.text):
                raise SexpgpuError("E-READ-003", "the string opened here is never closed: expected '\"'.", start)
            char = self.text[self.pos]
            if char == '"':
                self.advance()
                return String("".join(chars), start)
            if char == "\\":
                chars.append(self.read_escape(start))
                continue
            chars.append(char)
            self.advance()

    def read_escape(self, string_start: Location) -> str:
        escape_at = self.here()
        self.advance()
        if self.pos >= len(self.text):
            raise SexpgpuError("E-READ-003", "the string opened here is never closed: expected '\"'.", string_start)
        code = self.text[self.pos]
        if code not in _ESCAPES:
            raise SexpgpuError(
                "E-READ-004",
                f"unknown escape '\\{code}' in a string: expected one of \\n \\t \\r \\0 \\\\ \\\".",
                escape_at,
            )
        self.advance()
        return _ESCAPES[code]

    def read_atom(self):
        start = self.here()
        begin = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in _DELIMITERS:
            self.advance()
        return _classify(self.text[begin : self.pos], start)


def _missing_paren_hint(text: str, start: Location) -> str | None:
    """Point at the first later line that starts a form in column 1: usually where a ')' is missing."""
    lines = text.split("\n")
    for number in range(start.line + 1, len(lines) + 1):
        if lines[number - 1].startswith("("):
            return f"A form starts in column 1 on line {number} while it is still open: is a ')' missing before it?"
    return None


def _integer(token: str, loc: Location) -> Integer:
    """An integer literal of any length. Past `EXACT_DIGITS` significant digits it is larger
    than every range of the language, and converting it exactly would cost time quadratic in
    its length, so it reads as a stand-in of its sign and of magnitude 10^EXACT_DIGITS, and
    keeps its text for messages and for the resolved experiment."""
    digits = token.lstrip("+-").replace("_", "").lstrip("0")
    if len(digits) <= EXACT_DIGITS:
        return Integer(int(token.replace("_", "")), loc)
    sign = -1 if token.startswith("-") else 1
    return Integer(sign * 10**EXACT_DIGITS, loc, token)


def _classify(token: str, loc: Location):
    if _INTEGER.match(token):
        return _integer(token, loc)
    if _FLOAT.match(token):
        value = float(token.replace("_", ""))
        if math.isinf(value):
            raise SexpgpuError("E-READ-005", f"'{token}' is too large for a float: the largest is about 1.8e308.", loc)
        return Float(value, token, loc)
    if token.startswith(":"):
        name = token[1:]
        if not name or not _SYMBOL.match(name):
            raise SexpgpuError("E-READ-007", f"'{token}' is not a keyword: expected ':' followed by a name.", loc)
        return Keyword(name, loc)
    if _LOOKS_NUMERIC.match(token):
        raise SexpgpuError(
            "E-READ-005",
            f"'{token}' is not a number: expected an integer like 12 or a float like 0.5 or 1e-3.",
            loc,
        )
    if not _SYMBOL.match(token):
        raise SexpgpuError(
            "E-READ-007",
            f"'{token}' is not a valid symbol: a symbol starts with a letter or one of _*+-/<>=!?&%.$^~.",
            loc,
        )
    return Symbol(token, loc)
