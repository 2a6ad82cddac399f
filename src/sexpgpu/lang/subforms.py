"""Forms inside forms, `(HEAD ARG ... :KEY VALUE ...)`, each checked against a table of heads.

The optimizers, schedules, data sources, passes, checkpoints and initializers are each one
table `{head: FormSpec}`. A spec lists its positional arguments (all required, before any
keyword) and its keyword table, and builds the resolved value. A head whose spec needs no
argument and no keyword may also be written bare: `constant` for `(constant)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.lang.keywords import REQUIRED, first_keyword, read_keys
from sexpgpu.lang.syntax import SList, Symbol
from sexpgpu.lang.values import type_error


@dataclass(frozen=True)
class FormSpec:
    build: Callable[..., Any]  # (values by name, the form's syntax, context) -> resolved value
    arguments: tuple = ()  # ((NAME, converter), ...): positional, in order
    keys: dict = field(default_factory=dict)  # keyword name -> Key

    def usage(self, head: str) -> str:
        words = [head] + [name for name, _ in self.arguments]
        words += [f":{name} {name.upper()}" for name, key in self.keys.items() if key.default is REQUIRED]
        return "(" + " ".join(words) + ")"

    def takes_nothing(self) -> bool:
        return not self.arguments and all(key.default is not REQUIRED for key in self.keys.values())


def read_form(value, specs: dict, label: str, noun: str, context=None):
    """`value` checked against `specs[HEAD]` and built; `label` names the slot (`:optimizer`)."""
    if isinstance(value, Symbol):
        return _read_bare(value, specs, label, noun, context)
    if not isinstance(value, SList) or not value.items or not isinstance(value.items[0], Symbol):
        raise type_error(f"{_article(noun)} {noun} like {_example(specs)}", label, value)
    head = value.items[0]
    spec = spec_for(head, specs, label, noun)
    where = f"({head.name} ...)"
    end = 1 + first_keyword(value.items[1:])
    values = read_arguments(value, value.items[1:end], spec, where, context)
    values.update(read_keys(value.items[end:], spec.keys, where, value, context))
    return spec.build(values, value, context)


def read_arguments(form: SList, given, spec: FormSpec, where: str, context) -> dict:
    expected = len(spec.arguments)
    if len(given) != expected:
        names = " ".join(name for name, _ in spec.arguments)
        takes = f"{expected} argument{'s' if expected != 1 else ''}" + (f" ({names})" if names else "")
        place = given[expected].loc if len(given) > expected else form.loc
        raise SexpgpuError(
            "E-FORM-009",
            f"{where} takes {takes} before its keywords, found {len(given)}: expected {spec.usage(form.head)}.",
            place,
        )
    return {
        name: convert(item, f"the {name} of {where}", context)
        for (name, convert), item in zip(spec.arguments, given)
    }


def spec_for(head: Symbol, specs: dict, label: str, noun: str) -> FormSpec:
    if head.name not in specs:
        raise SexpgpuError(
            "E-FORM-001",
            f"unknown {noun} '{head.name}' for {label}: expected one of {', '.join(specs)}.",
            head.loc,
            did_you_mean(head.name, list(specs)),
        )
    return specs[head.name]


def _read_bare(value: Symbol, specs: dict, label: str, noun: str, context):
    spec = spec_for(value, specs, label, noun)
    if not spec.takes_nothing():
        raise SexpgpuError(
            "E-FORM-009",
            f"the {noun} '{value.name}' for {label} needs arguments: expected {spec.usage(value.name)}.",
            value.loc,
        )
    return spec.build(read_keys((), spec.keys, value.name, None, context), value, context)


def _example(specs: dict) -> str:
    head, spec = next(iter(specs.items()))
    return spec.usage(head)


def _article(noun: str) -> str:
    return "an" if noun[:1] in "aeiou" else "a"
