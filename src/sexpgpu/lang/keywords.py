"""Keyword/value pairs read against a table: the one way every form takes its keywords.

A table maps a keyword's name (without the colon) to a `Key`: how to convert its value and
its default. `read_keys` reports, in the order of the text, a non-keyword where a keyword
belongs or a keyword without a value (E-FORM-010), a keyword given twice (E-FORM-005), an
unknown keyword with the nearest known one (E-FORM-002), a bad value (the converter's code),
and finally a missing required keyword (E-FORM-004).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.lang.syntax import Keyword, SList, describe


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class Key:
    convert: Callable[..., Any]  # (value syntax, label, context) -> plain value
    default: Any = REQUIRED
    expects: str = "a value"  # what a message about a missing required keyword asks for


def first_keyword(items) -> int:
    """The index of the first keyword in `items`, or len(items): where positional arguments end."""
    for index, item in enumerate(items):
        if isinstance(item, Keyword):
            return index
    return len(items)


def split_pairs(items, where: str) -> dict:
    """`{name: (keyword syntax, value syntax)}` from alternating keywords and values, in order."""
    pairs: dict = {}
    for index in range(0, len(items), 2):
        key = items[index]
        if not isinstance(key, Keyword):
            raise SexpgpuError(
                "E-FORM-010",
                f"expected a keyword like :name in {where}, found {describe(key)}: "
                "after the first keyword, keywords and values alternate.",
                key.loc,
            )
        if index + 1 >= len(items):
            raise SexpgpuError("E-FORM-010", f"{key} in {where} has no value: expected a value after it.", key.loc)
        if key.name in pairs:
            first = pairs[key.name][0].loc
            raise SexpgpuError("E-FORM-005", f"{key} is given twice in {where}; the first is at {first}.", key.loc)
        pairs[key.name] = (key, items[index + 1])
    return pairs


def read_keys(items, table: dict, where: str, owner: SList, context=None) -> dict:
    """The converted value of every keyword in `table`, given or defaulted, in table order."""
    pairs = split_pairs(items, where)
    for name, (key, _) in pairs.items():
        if name not in table:
            raise unknown_keyword(key, table, where)
    given = {name: table[name].convert(value, f":{name}", context) for name, (_, value) in pairs.items()}
    values = {}
    for name, spec in table.items():
        if name in given:
            values[name] = given[name]
        elif spec.default is REQUIRED:
            raise SexpgpuError(
                "E-FORM-004", f"{where} has no :{name}: expected :{name} followed by {spec.expects}.", owner.loc
            )
        else:
            values[name] = spec.default
    return values


def unknown_keyword(key: Keyword, table, where: str) -> SexpgpuError:
    known = ", ".join(f":{name}" for name in table) or "none"
    return SexpgpuError(
        "E-FORM-002",
        f"unknown keyword {key} in {where}: the keywords it takes are {known}.",
        key.loc,
        did_you_mean(key.name, list(table), ":"),
    )
