"""Expressions to Triton source lines.

Every node becomes one assignment, in the fixed order of `nodes_in_order`, so a node shared
by several outputs is computed once. Division and square root are IEEE (`div_rn`,
`sqrt_rn`); the math functions are imported from `mathlib.provider`. The leaves that depend
on the kernel's shape (loads, per-row values, positions) are rendered by the kernel's own
`leaf` callback.
"""

from __future__ import annotations

import math

from sexpgpu.backends.cuda.codegen import mathlib
from sexpgpu.backends.cuda.codegen.expr import Expr, nodes_in_order

TRITON_TYPES = {"f32": "tl.float32", "i32": "tl.int32", "bool": "tl.int1", "bf16": "tl.bfloat16"}
INFIX = {"add": "+", "sub": "-", "mul": "*", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
         "eq": "==", "ne": "!=", "and": "&", "or": "|"}
LEAVES = ("load", "scalar", "row", "iota")
# The other ops, each a template over its arguments' names
TEMPLATES = {
    "div": "tl.div_rn({0}, {1})",
    "max": "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    "min": "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    "neg": "(-{0})",
    "not": "({0} == 0)",
    "abs": "tl.abs({0})",
    "sqrt": "tl.sqrt_rn({0})",
    "relu": "tl.where({0} > 0.0, {0}, tl.where({0} != {0}, {0}, 0.0))",
    "round_bf16": "round_bf16({0})",
    "where": "tl.where({0}, {1}, {2})",
}
BITS_IMPORT = "from sexpgpu.backends.cuda.codegen.bits import add, load_bf16, max_nan, min_nan, round_bf16, store_bf16"


def float_literal(value: float) -> str:
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


class Renderer:
    """Accumulates the lines of one kernel body; `value(expr)` returns a variable name."""

    def __init__(self, leaf, indent: str = "    ", counter: list | None = None):
        self.leaf = leaf
        self.indent = indent
        self.lines: list[str] = []
        self.names: dict[Expr, str] = {}
        self.imports: set[str] = {BITS_IMPORT}
        self.uses_table = False  # a math function reads the numerics table (argument `tab`)
        self.counter = counter if counter is not None else [0]  # shared with nested blocks

    def value(self, root: Expr) -> str:
        for node in nodes_in_order([root]):
            if node not in self.names:
                self._emit(node)
        return self.names[root]

    def scoped(self) -> "Renderer":
        """A renderer for a nested block (a loop body): it sees the names already made and
        its own names are forgotten when the block ends."""
        inner = Renderer(self.leaf, self.indent + "    ", self.counter)
        inner.names = dict(self.names)
        inner.imports = self.imports
        inner.parent = self
        return inner

    def _use_table(self) -> None:
        renderer = self
        while renderer is not None:
            renderer.uses_table = True
            renderer = getattr(renderer, "parent", None)

    def _emit(self, node: Expr) -> None:
        name = f"v{self.counter[0]}"
        self.counter[0] += 1
        args = [self.names[child] for child in node.args]
        self.lines.append(f"{self.indent}{name} = {self._expression(node, args)}")
        self.names[node] = name

    def _expression(self, node: Expr, args: list[str]) -> str:
        op = node.op
        if op in LEAVES:
            return self.leaf(node, args)
        if op == "const":
            if node.dtype == "f32":
                return f"tl.full([], {float_literal(node.attr)}, tl.float32)"
            if node.dtype == "bool":
                return f"tl.full([], {int(bool(node.attr))}, tl.int1)"
            return f"tl.full([], {int(node.attr)}, tl.int32)"
        if op in INFIX:
            return f"({args[0]} {INFIX[op]} {args[1]})"
        if op in TEMPLATES:
            return TEMPLATES[op].format(*args)
        if op == "cast":
            return f"{args[0]}.to({TRITON_TYPES[node.dtype]})"
        if op in mathlib.FUNCTIONS:
            self.imports.add(mathlib.import_line(op))
            self._use_table()
            return f"m_{op}({', '.join(args)}, tab)"
        raise ValueError(f"cannot render op {op}")
