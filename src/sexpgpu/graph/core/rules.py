"""Rules registered against ops: one table per backend and concern.

An op is defined once, in ops.py. What a backend does with it (the interpreter's kernel, the
CUDA lowering, an exact sum) is a rule in a `RuleTable` of that backend's module for that
concern, registered against the op by name:

    KERNELS = RuleTable("cpu kernels")

    @KERNELS.rule("layernorm")
    def layernorm(node, values): ...

A table says which ops it must cover (`needs`, every op by default); `missing()` names those
without a rule, and tests/architecture walks every table made (`TABLES`) so an op added to
ops.py without its rules fails there, by name. `remove` takes a rule back (tests that add an
op of their own, with ops.undefine).
"""

from __future__ import annotations

from typing import Callable, Iterator

from sexpgpu.graph.core.ops import OPS, OpDef

TABLES: list["RuleTable"] = []


def _op_name(op) -> str:
    name = op.name if isinstance(op, OpDef) else op
    if name not in OPS:
        raise KeyError(f"no op named {name!r} in graph/core/ops.py")
    return name


class RuleTable:
    """Rules by op name. `needs(op) -> bool` says which ops of OPS the table must cover."""

    def __init__(self, concern: str, needs: Callable[[OpDef], bool] = lambda op: True):
        self.concern = concern
        self.needs = needs
        self._rules: dict = {}
        TABLES.append(self)

    def rule(self, *ops) -> Callable:
        """A decorator registering the function as the rule of each op named."""

        def register(function):
            for op in ops:
                self.add(op, function)
            return function

        return register

    def add(self, op, rule) -> None:
        name = _op_name(op)
        if name in self._rules:
            raise KeyError(f"{self.concern}: a second rule for {name!r}")
        self._rules[name] = rule

    def update(self, rules: dict) -> None:
        for op, rule in rules.items():
            self.add(op, rule)

    def remove(self, name: str) -> None:
        del self._rules[name]

    def __getitem__(self, name: str):
        return self._rules[name]

    def get(self, name: str, default=None):
        return self._rules.get(name, default)

    def __contains__(self, name) -> bool:
        return name in self._rules

    def __iter__(self) -> Iterator[str]:
        return iter(self._rules)

    def items(self):
        return self._rules.items()

    def missing(self) -> list[str]:
        """The ops this table must cover and has no rule for, in OPS's order."""
        return [name for name, op in OPS.items() if self.needs(op) and name not in self._rules]
