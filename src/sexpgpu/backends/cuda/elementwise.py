"""The IR's elementwise ops as kernel expressions, rounding where the CPU interpreter rounds
(backends/cpu/op_kernels.py): float arithmetic in float32, each node of dtype bf16 rounded to
bfloat16 after it, constants rounded once to their node's dtype.

`EXPRESSIONS[op](node, args)` takes the input expressions, already broadcast to the node's
shape, and returns the node's value before its bf16 rounding.
"""

from __future__ import annotations

import numpy as np

from sexpgpu.backends.cuda.codegen.expr import Expr, binary, cast, const, iota, unary, where
from sexpgpu.backends.cuda.codegen.space import unit_view
from sexpgpu.graph.core.rules import RuleTable

_INT32_LOW = float(-(2**31))
_INT32_HIGH = float(2**31 - 128)  # the largest float32 below 2^31
_ROOT_HALF = float(np.float32(0.7071067811865476))
ELEMENTWISE_KINDS = ("unary", "binary", "compare", "select")
ELEMENTWISE_OTHERS = ("const", "causal_mask", "one_hot")  # sources and an index op that are expressions too


def constant(value, dtype: str) -> Expr:
    if dtype == "bool":
        return const(bool(value), "bool")
    if dtype == "i32":
        return const(int(value), "i32")
    rounded = np.float32(value)
    if dtype == "bf16":
        from sexpgpu.backends.cpu.arith import round_bf16

        rounded = round_bf16(np.asarray([rounded]))[0]
    return const(float(rounded), "f32")


def convert(x: Expr, source: str, target: str) -> Expr:
    """The interpreter's cast: to a float through float32; to i32 toward zero, NaN to 0,
    saturating; to bool, nonzero."""
    if target == "bool":
        return x if x.dtype == "bool" else binary("ne", x, const(0, "i32") if x.dtype == "i32" else const(0.0))
    if target in ("f32", "bf16"):
        wide = x if x.dtype == "f32" else cast(x, "f32")
        return cast(wide, "bf16") if target == "bf16" and source != "bf16" else wide
    if x.dtype == "f32":
        bounded = binary("min", binary("max", x, const(_INT32_LOW)), const(_INT32_HIGH))
        return cast(where(binary("ne", x, x), const(0.0), bounded), "i32")
    return cast(x, "i32")


def _gelu(node, args):
    (x,) = args
    return (x * 0.5) * (1.0 + unary("erf", x * _ROOT_HALF))


def _relu(node, args):
    (x,) = args
    return where(binary("lt", x, const(0.0)), const(0.0), x)


def _neg(node, args):
    (x,) = args
    return binary("sub", const(0, "i32"), x) if x.dtype == "i32" else unary("neg", x)


def _unary(op: str):
    return lambda node, args: unary(op, args[0])


def _binary(op: str):
    return lambda node, args: binary(op, args[0], args[1])


def _one_hot(node, args):
    (ids,) = args
    hit = binary("eq", ids, iota(unit_view(node.shape, len(node.shape) - 1)))
    return convert(hit, "bool", node.dtype)


def _causal_mask(node, args):
    return binary("le", iota(unit_view(node.shape, 1)), iota(unit_view(node.shape, 0)))


EXPRESSIONS = RuleTable("cuda expressions", needs=lambda op: op.kind in ELEMENTWISE_KINDS or op.name in ELEMENTWISE_OTHERS)
EXPRESSIONS.add("const", lambda node, args: constant(node.attrs["value"], node.dtype))
EXPRESSIONS.add("causal_mask", _causal_mask)
EXPRESSIONS.add("neg", _neg)
EXPRESSIONS.add("relu", _relu)
EXPRESSIONS.add("gelu", _gelu)
EXPRESSIONS.add("square", lambda node, args: args[0] * args[0])
EXPRESSIONS.add("cast", lambda node, args: convert(args[0], node.inputs[0].dtype, node.dtype))
EXPRESSIONS.add("where", lambda node, args: where(*args))
EXPRESSIONS.add("one_hot", _one_hot)
EXPRESSIONS.add("maximum", _binary("max"))
EXPRESSIONS.add("minimum", _binary("min"))
EXPRESSIONS.add("pow", lambda node, args: Expr("pow", tuple(args), None, "f32"))
for _op in ("tanh", "exp", "log", "sqrt", "rsqrt", "sigmoid", "erf"):
    EXPRESSIONS.add(_op, _unary(_op))
for _op in ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge"):
    EXPRESSIONS.add(_op, _binary(_op))
