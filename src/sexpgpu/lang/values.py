"""Converters from one atom of syntax to a plain value, each checking type and range.

A converter is called as `convert(value, label, context)`: `label` names the place in
messages (`:steps`), `context` is whatever the calling form passes (most ignore it).
Wrong types raise E-FORM-003, values out of range E-FORM-011.
"""

from __future__ import annotations

import math
import sys

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.lang.syntax import Float, Integer, String, Symbol, describe, shown

FLOAT_MAX = int(sys.float_info.max)  # an integer literal beyond this has no float value
_INFINITIES = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf}
_BOOLEANS = {"true": True, "false": False}


def type_error(expected: str, label: str, value) -> SexpgpuError:
    return SexpgpuError("E-FORM-003", f"expected {expected} for {label}, found {describe(value)}.", value.loc)


def range_error(label: str, condition: str, value) -> SexpgpuError:
    return SexpgpuError("E-FORM-011", f"{label} must be {condition}, found {shown(value)}.", value.loc)


def range_text(minimum=None, maximum=None, *, above: bool = False, below: bool = False) -> str:
    """`at least 1`, `from 0 to 1`, `greater than 0 and less than 1`: the words for a range."""
    if minimum is not None and maximum is not None and not above and not below:
        return f"from {minimum} to {maximum}"
    parts = []
    if minimum is not None:
        parts.append(f"greater than {minimum}" if above else f"at least {minimum}")
    if maximum is not None:
        parts.append(f"less than {maximum}" if below else f"at most {maximum}")
    return " and ".join(parts)


def integer(minimum: int | None = None, maximum: int | None = None, *, maximum_text: str | None = None):
    """An integer literal within [minimum, maximum]."""
    condition = range_text(minimum, maximum_text or maximum)

    def convert(value, label, context=None):
        if not isinstance(value, Integer):
            raise type_error("an integer", label, value)
        too_low = minimum is not None and value.value < minimum
        too_high = maximum is not None and value.value > maximum
        if too_low or too_high:
            raise range_error(label, condition, value)
        return value.value

    return convert


def number(minimum=None, maximum=None, *, above: bool = False, below: bool = False, infinite: bool = False):
    """An integer or float literal, as a float, within the range; `inf` too when `infinite`."""
    condition = range_text(minimum, maximum, above=above, below=below)
    expected = "a number or inf" if infinite else "a number"

    def convert(value, label, context=None):
        if isinstance(value, Integer) and abs(value.value) > FLOAT_MAX:
            raise range_error(label, f"{condition or 'a number'} (a float: at most about 1.8e308 in size)", value)
        if isinstance(value, (Integer, Float)):
            result = float(value.value)
        elif infinite and isinstance(value, Symbol) and value.name in _INFINITIES:
            result = _INFINITIES[value.name]
        else:
            raise type_error(expected, label, value)
        if not _within(result, minimum, maximum, above, below):
            raise range_error(label, condition, value)
        return result

    return convert


def _within(result: float, minimum, maximum, above: bool, below: bool) -> bool:
    if minimum is not None and (result <= minimum if above else result < minimum):
        return False
    if maximum is not None and (result >= maximum if below else result > maximum):
        return False
    return True


def boolean(value, label, context=None) -> bool:
    if isinstance(value, Symbol) and value.name in _BOOLEANS:
        return _BOOLEANS[value.name]
    raise type_error("true or false", label, value)


def string(value, label, context=None) -> str:
    if not isinstance(value, String):
        raise type_error("a string", label, value)
    return value.value


def symbol(value, label, context=None) -> str:
    if not isinstance(value, Symbol):
        raise type_error("a name (a symbol)", label, value)
    return value.name


def one_of(*names: str):
    """A symbol among `names`."""

    def convert(value, label, context=None):
        if not isinstance(value, Symbol):
            raise type_error("one of " + ", ".join(names), label, value)
        if value.name not in names:
            raise SexpgpuError(
                "E-FORM-011",
                f"{label} must be one of {', '.join(names)}, found {value.name}.",
                value.loc,
                did_you_mean(value.name, names),
            )
        return value.name

    return convert


def literal(value, label, context=None):
    """An option's default: an integer, a float, a string, true or false."""
    if isinstance(value, (Integer, Float, String)):
        return value.value
    if isinstance(value, Symbol) and value.name in _BOOLEANS:
        return _BOOLEANS[value.name]
    raise type_error("an integer, a float, a string, true or false", label, value)


def like(default):
    """A value of the same type as `default` (an integer literal also serves for a float)."""
    if isinstance(default, bool):
        return boolean
    if isinstance(default, int):
        return integer()
    if isinstance(default, float):
        return number()
    return string
