"""The values the reader produces. Each carries the location of its first character,
so that every later stage can point at the text it is complaining about."""

from __future__ import annotations

from dataclasses import dataclass, field

from sexpgpu.errors import Location


@dataclass(frozen=True)
class Symbol:
    name: str
    loc: Location = field(compare=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Keyword:
    """`:seed` reads as Keyword("seed")."""

    name: str
    loc: Location = field(compare=False)

    def __str__(self) -> str:
        return ":" + self.name


@dataclass(frozen=True)
class Integer:
    """`value` is exact up to the reader's EXACT_DIGITS; a longer literal keeps its `text`."""

    value: int
    loc: Location = field(compare=False)
    text: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.text if self.text is not None else str(self.value)


@dataclass(frozen=True)
class Float:
    value: float
    text: str
    loc: Location = field(compare=False)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class String:
    value: str
    loc: Location = field(compare=False)

    def __str__(self) -> str:
        return '"' + self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass(frozen=True)
class SList:
    items: tuple
    loc: Location = field(compare=False)
    end: Location | None = field(default=None, compare=False)

    def __str__(self) -> str:
        # An explicit stack, not recursion: a list may nest thousands deep.
        parts = []
        pending: list = [self]
        while pending:
            item = pending.pop()
            if isinstance(item, SList):
                pending.append(")")
                for index in range(len(item.items) - 1, -1, -1):
                    pending.append(item.items[index])
                    if index:
                        pending.append(" ")
                parts.append("(")
            else:
                parts.append(str(item))
        return "".join(parts)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]

    @property
    def head(self) -> str | None:
        """The name of the leading symbol, or None."""
        if self.items and isinstance(self.items[0], Symbol):
            return self.items[0].name
        return None


Atom = Symbol | Keyword | Integer | Float | String
Syntax = Atom | SList


def kind_name(value) -> str:
    """How an error message names what it found."""
    return {
        Symbol: "a symbol",
        Keyword: "a keyword",
        Integer: "an integer",
        Float: "a float",
        String: "a string",
        SList: "a list",
    }.get(type(value), type(value).__name__)


def describe(value, limit: int = 40) -> str:
    """`a string "ten"`: what a message says it found, shortened past `limit` characters."""
    return f"{kind_name(value)} {shown(value, limit)}"


def shown(value, limit: int = 40) -> str:
    """The text of `value`, shortened past `limit` characters (a number of 5,000 digits
    would otherwise fill the terminal)."""
    text = str(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
