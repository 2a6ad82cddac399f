"""What a generated kernel computes: a small expression DAG per kernel.

An `Expr` is a pure value: `load` reads an operand at the element the kernel is on, `row`
names a per-row scalar that an earlier reduction of a row kernel produced, and every other
op combines values. Floating-point values are computed in float32; a node whose graph dtype
is bf16 is followed by `round_bf16`, so fusing nodes keeps each node's rounding.
Equal expressions are equal objects, which is what lets the renderer share them (CSE).
"""

from __future__ import annotations

from dataclasses import dataclass, field

UNARY = ("neg", "abs", "exp", "log", "tanh", "erf", "sqrt", "rsqrt", "sigmoid", "relu",
         "round_bf16", "not")
BINARY = ("add", "sub", "mul", "div", "max", "min", "lt", "le", "gt", "ge", "eq", "ne", "and", "or")
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
# Flops the fusion planner counts for an op (1 unless listed): the math functions are the
# portable float64 algorithms of sexpgpu.numerics, dozens of float64 operations and a table
# lookup each.
FLOPS = {"exp": 40, "log": 40, "tanh": 50, "sigmoid": 50, "erf": 60, "rsqrt": 30, "pow": 120,
         "sqrt": 4, "div": 4}


@dataclass(frozen=True)
class Expr:
    op: str
    args: tuple = ()
    attr: object = None
    dtype: str = "f32"  # f32, i32 or bool: the type the kernel computes in
    # Levels from here to the deepest leaf. Comparing, hashing and rewriting an expression
    # recurse through it, so the lowering keeps it bounded (fusion.MAX_FUSED_DEPTH).
    depth: int = field(default=1, init=False, compare=False, repr=False)
    # The hash, made once from the arguments' own: hashing anew would walk the whole tree
    # each time, and the lowering hashes every node of every kernel many times.
    _hash: int = field(default=0, init=False, compare=False, repr=False)

    def __post_init__(self):
        if self.args:
            object.__setattr__(self, "depth", 1 + max(arg.depth for arg in self.args))
        object.__setattr__(self, "_hash", hash((self.op, self.args, self.attr, self.dtype)))

    def __hash__(self) -> int:
        return self._hash

    def __add__(self, other):
        return binary("add", self, other)

    def __radd__(self, other):
        return binary("add", other, self)

    def __sub__(self, other):
        return binary("sub", self, other)

    def __rsub__(self, other):
        return binary("sub", other, self)

    def __mul__(self, other):
        return binary("mul", self, other)

    def __rmul__(self, other):
        return binary("mul", other, self)

    def __truediv__(self, other):
        return binary("div", self, other)

    def __rtruediv__(self, other):
        return binary("div", other, self)

    def __neg__(self):
        return unary("neg", self)


def lift(value) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Expr("const", (), value, "bool")
    if isinstance(value, int):
        return Expr("const", (), value, "i32")
    return Expr("const", (), float(value), "f32")


def const(value, dtype: str = "f32") -> Expr:
    return Expr("const", (), float(value) if dtype == "f32" else int(value), dtype)


def load(operand, view, dtype: str = "f32") -> Expr:
    """Operand `operand` read through `view` at the kernel's current position. Before a
    kernel is built the operand is any key (the lowering uses buffer names);
    `number_operands` turns keys into argument positions."""
    return Expr("load", (), (operand, view), _compute_dtype(dtype))


def iota(view) -> Expr:
    """The integer a view gives at the current position, without reading memory: with a
    unit stride along one axis, the coordinate there."""
    return Expr("iota", (), view, "i32")


def scalar(operand: int, dtype: str = "f32") -> Expr:
    """A 0-d device tensor: learning rates, steps and salts, read at run time so that a
    captured CUDA graph replays with new values."""
    return Expr("scalar", (), operand, _compute_dtype(dtype))


def row(index: int) -> Expr:
    """The row kernel's per-row result number `index` (reductions in declaration order)."""
    return Expr("row", (), index, "f32")


def unary(op: str, x) -> Expr:
    x = lift(x)
    if op not in UNARY:
        raise ValueError(f"unknown unary op {op}")
    dtype = "bool" if op == "not" else x.dtype if op in ("neg", "abs") else "f32"
    return Expr(op, (x,), None, dtype)


def binary(op: str, a, b) -> Expr:
    a, b = lift(a), lift(b)
    if op not in BINARY:
        raise ValueError(f"unknown binary op {op}")
    if op in COMPARISONS or op in ("and", "or"):
        return Expr(op, (a, b), None, "bool")
    dtype = "i32" if a.dtype == "i32" and b.dtype == "i32" and op != "div" else "f32"
    return Expr(op, (a, b), None, dtype)


def where(condition, a, b) -> Expr:
    a, b = lift(a), lift(b)
    dtype = "i32" if a.dtype == "i32" and b.dtype == "i32" else "f32"
    return Expr("where", (lift(condition), a, b), None, dtype)


def cast(x, dtype: str) -> Expr:
    """A conversion between the compute types; to bf16 it rounds to nearest even."""
    x = lift(x)
    if dtype == "bf16":
        return unary("round_bf16", cast(x, "f32") if x.dtype != "f32" else x)
    if dtype == x.dtype:
        return x
    return Expr("cast", (x,), None, dtype)


def map_leaves(value: Expr, change, memo: dict | None = None) -> Expr:
    """The expression with every leaf replaced by `change(leaf)` (a leaf it returns as is
    stays); inner nodes are rebuilt only where a leaf below them changed."""
    memo = {} if memo is None else memo
    if value in memo:
        return memo[value]
    if not value.args:
        result = change(value)
    else:
        args = tuple(map_leaves(arg, change, memo) for arg in value.args)
        result = value if args == value.args else Expr(value.op, args, value.attr, value.dtype)
    memo[value] = result
    return result


def shift_operands(value: Expr, by: int) -> Expr:
    """The same expression reading operand k + by wherever it read operand k: for a kernel
    whose signature puts `by` new operands first."""
    def change(leaf: Expr) -> Expr:
        if leaf.op == "load":
            operand, view = leaf.attr
            return Expr("load", (), (operand + by, view), leaf.dtype)
        if leaf.op == "scalar":
            return Expr("scalar", (), leaf.attr + by, leaf.dtype)
        return leaf

    return map_leaves(value, change)


def expression_text(roots) -> list[str]:
    """The expressions as lines, each node once and named by its place (`%2 = mul(%0, %1)`),
    then the roots."""
    names: dict = {}
    lines = []
    for node in nodes_in_order(roots):
        attr = "" if node.attr is None else f" {node.attr}"
        lines.append(f"%{len(names)} = {node.op}{attr}({', '.join(names[arg] for arg in node.args)}) {node.dtype}")
        names[node] = f"%{len(names)}"
    return lines + ([f"roots {' '.join(names[root] for root in roots)}"] if lines else [])


def nodes_in_order(roots) -> list[Expr]:
    """Every node reachable from `roots`, children before parents, each once, in a fixed
    order (depth first, arguments left to right)."""
    seen: dict[Expr, None] = {}
    stack = [(root, False) for root in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if node in seen:
            continue
        if expanded:
            seen[node] = None
            continue
        stack.append((node, True))
        for child in reversed(node.args):
            if child not in seen:
                stack.append((child, False))
    return list(seen)


def flops(roots) -> int:
    """Flops per element of evaluating `roots` once: the planner's recompute cost."""
    total = 0
    for node in nodes_in_order(roots):
        if node.op in ("load", "const", "scalar", "row", "iota"):
            continue
        total += FLOPS.get(node.op, 1)
    return total


def _compute_dtype(storage: str) -> str:
    return "f32" if storage in ("f32", "bf16") else "bool" if storage == "bool" else "i32"


def number_operands(roots, first: int = 0) -> tuple[list[Expr], list]:
    """The roots with every operand key (of loads and scalars) replaced by its argument
    position, counted from `first` in order of first appearance, and the keys in that order."""
    keys: dict = {}

    def position(key) -> int:
        if key not in keys:
            keys[key] = first + len(keys)
        return keys[key]

    def change(leaf: Expr) -> Expr:
        if leaf.op == "load":
            key, view = leaf.attr
            return Expr("load", (), (position(key), view), leaf.dtype)
        if leaf.op == "scalar":
            return Expr("scalar", (), position(leaf.attr), leaf.dtype)
        return leaf

    memo: dict = {}
    numbered = [map_leaves(root, change, memo) for root in roots]
    return numbered, list(keys)


def operand_views(roots) -> list:
    """Every view a load in `roots` reads through (to size the kernel's index type)."""
    return [node.attr[1] for node in nodes_in_order(roots) if node.op == "load"]
