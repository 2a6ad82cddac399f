"""Parameter initializers: `zeros`, `ones`, `(normal :mean M :std S)`, ... (docs/language.md).

`read_initializer` turns the syntax after `:init` into an `InitSpec` with every keyword
filled in; the graph stage draws from it. Keyword values are number literals.
"""

from __future__ import annotations

from sexpgpu.errors import SexpgpuError
from sexpgpu.lang.experiment import InitSpec
from sexpgpu.lang.keywords import Key
from sexpgpu.lang.subforms import FormSpec, read_form
from sexpgpu.lang.values import number


def _build(kind: str):
    def build(values: dict, form, context) -> InitSpec:
        args = {name.replace("-", "_"): value for name, value in values.items()}
        if kind == "uniform" and not args["low"] < args["high"]:
            raise SexpgpuError(
                "E-FORM-011",
                f"(uniform ...) needs :low less than :high, found :low {args['low']} and :high {args['high']}.",
                form.loc,
            )
        return InitSpec(kind, args, form.loc)

    return build


_MEAN = Key(number(), 0.0, "a number")
_STD = Key(number(0, above=True), 1.0, "a number greater than 0")

_KEYS = {
    "zeros": {},
    "ones": {},
    "normal": {"mean": _MEAN, "std": _STD},
    "uniform": {"low": Key(number(), 0.0, "a number"), "high": Key(number(), 1.0, "a number")},
    "truncated-normal": {"mean": _MEAN, "std": _STD, "bound": Key(number(0, above=True), 2.0, "a number")},
    "glorot-uniform": {},
    "glorot-normal": {},
    "he-uniform": {},
    "he-normal": {},
    "small-init": {},
}

INITIALIZERS = {kind: FormSpec(_build(kind), keys=keys) for kind, keys in _KEYS.items()}


def read_initializer(value, label: str = ":init") -> InitSpec:
    return read_form(value, INITIALIZERS, label, "initializer")
