"""Salts: what picks another stream for a draw (docs/language.md, "Draws").

A SALT is `:step`, `:microbatch`, `:trip`, `(field NAME)`, or a list of these. `read_salt` gives a
tuple of parts, each "step", "microbatch", "trip" or "field/NAME", in the order written.
"""

from __future__ import annotations

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.lang.syntax import Keyword, SList, Symbol
from sexpgpu.lang.values import type_error

SALT_KEYWORDS = ("step", "microbatch", "trip")
_EXPECTED = "a salt: :step, :microbatch, :trip, (field NAME) or a list of these"


def read_salt(value, label: str = ":salt") -> tuple[str, ...]:
    if isinstance(value, SList) and value.head != "field":
        if not value.items:
            raise type_error(_EXPECTED, label, value)
        return tuple(_read_part(item, label) for item in value.items)
    return (_read_part(value, label),)


def _read_part(value, label: str) -> str:
    if isinstance(value, Keyword):
        if value.name not in SALT_KEYWORDS:
            raise SexpgpuError(
                "E-FORM-002",
                f"unknown salt {value} for {label}: expected :step, :microbatch, :trip or (field NAME).",
                value.loc,
                did_you_mean(value.name, SALT_KEYWORDS, ":"),
            )
        return value.name
    if isinstance(value, SList) and value.head == "field":
        if len(value.items) != 2 or not isinstance(value.items[1], Symbol):
            raise SexpgpuError(
                "E-FORM-009", f"(field ...) in {label} takes one record field name, found {value}.", value.loc
            )
        return f"field/{value.items[1].name}"
    raise type_error(_EXPECTED, label, value)
