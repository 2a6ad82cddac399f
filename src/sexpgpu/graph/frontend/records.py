"""What a graph body declares (a parameter's `ParamSpec`, its `Initializer` or `LoadSpec`) and
the `Frame` it is evaluated in: made by the built-in ops (layers.py) and the builder (build.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Initializer:
    """How a parameter starts: `zeros`, `ones` or a draw, with every keyword filled in."""

    name: str  # as in the language: "zeros", "normal", "truncated-normal", "glorot-uniform", ...
    params: tuple = ()  # ((keyword with '-' as '_', float), ...), sorted by keyword


@dataclass(frozen=True)
class LoadSpec:
    source: str  # the file named by :load
    tensor: str  # the tensor in it: :tensor, or the parameter's path


@dataclass(frozen=True)
class ParamSpec:
    path: str
    shape: tuple
    dtype: str  # "f32" or "bf16"
    init: Initializer | None
    load: LoadSpec | None
    loc: object = field(default=None, compare=False)


@dataclass
class Frame:
    """One graph body being evaluated: its bindings, scope and definition."""

    env: dict
    scope: str
    graph_name: str


def join_path(scope: str, name: str) -> str:
    return f"{scope}/{name}" if scope else name


def initializer_of(spec) -> Initializer:
    """An Initializer from the forms stage's InitSpec (kind, args)."""
    return Initializer(spec.kind, tuple(sorted((name, float(value)) for name, value in spec.args.items())))
