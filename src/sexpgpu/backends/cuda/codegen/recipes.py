"""The row ops of the IR as phases of a row kernel, written to round where the CPU
interpreter rounds (backends/cpu/op_kernels.py), so that the two differ only by the order of
their sums and by math functions that are not yet the portable ones.

Each recipe takes the input's expression `x` over the row kernel's space and the number of
the first per-row value it may define (`first`), and returns (phases, per-row stores or
element stores). Row values are numbered in the order the phases define them.
"""

from __future__ import annotations

from sexpgpu.backends.cuda.codegen.expr import Expr, binary, cast, const, row, unary, where
from sexpgpu.backends.cuda.codegen.rows import Phase, Reduction


def softmax(x: Expr, output: int, first: int = 0) -> tuple[Phase, ...]:
    """exp(x - max) / fold(exp(x - max))."""
    top, total = row(first), row(first + 1)
    exps = unary("exp", x - top)
    return (Phase((Reduction("max", x),)),
            Phase((Reduction("sum", exps),)),
            Phase((), ((output, exps / total),)))


def log_softmax(x: Expr, output: int, first: int = 0) -> tuple[Phase, ...]:
    """(x - max) - log(fold(exp(x - max)))."""
    top, total = row(first), row(first + 1)
    shifted = x - top
    return (Phase((Reduction("max", x),)),
            Phase((Reduction("sum", unary("exp", shifted)),)),
            Phase((), ((output, shifted - unary("log", total)),)))


def layernorm(x: Expr, length: int, eps: float, output: int, first: int = 0) -> tuple[Phase, ...]:
    """c = x - fold(x) / D; var = fold(c * c) / D; c * rsqrt(var + eps)."""
    count = const(length)
    centered = x - row(first) / count
    variance = row(first + 1) / count
    scale = unary("rsqrt", variance + const(eps))
    return (Phase((Reduction("sum", x),)),
            Phase((Reduction("sum", centered * centered),)),
            Phase((), ((output, centered * scale),)))


def cross_entropy(x: Expr, label: Expr, column: Expr, first: int = 0,
                  exps_output: int | None = None) -> tuple[tuple[Phase, ...], Expr]:
    """-((x[label] - max) - log(fold(exp(x - max)))), as a per-row value. The picked
    logit is a sum of zeros and the one term at the label, which is exact.

    With `exps_output`, the pass that sums exp(x - max) also stores it there: divided by the
    sum (per-row value first + 1), that is softmax's recipe to the bit, so the loss's
    gradient reads the logits' softmax without computing an exponential again."""
    top, total, picked = row(first), row(first + 1), row(first + 2)
    shifted = x - top
    exps = unary("exp", shifted)
    chosen = where(binary("eq", column, label), shifted, const(0.0))
    stores = () if exps_output is None else ((exps_output, exps),)
    phases = (Phase((Reduction("max", x),)),
              Phase((Reduction("sum", exps), Reduction("sum", chosen)), stores))
    return phases, -(picked - unary("log", total))


def argmax(x: Expr, column: Expr, length: int, first: int = 0) -> tuple[tuple[Phase, ...], Expr]:
    """The first column holding the largest value (or the first NaN), as numpy's argmax."""
    top = row(first)
    hit = binary("or", binary("eq", x, top), binary("ne", x, x))
    position = where(hit, cast(column, "f32"), const(float(length)))
    phases = (Phase((Reduction("max", x),)), Phase((Reduction("min", position),)))
    return phases, cast(row(first + 1), "i32")
