"""An independent oracle: exact sums in fractions.Fraction, rounded once by rules written here.

Nothing here calls sexpgpu.exact. Rounding follows IEEE 754 binary formats directly: round
to nearest, ties to even, gradual underflow to subnormals, overflow to infinity, and an
exact zero sum is +0.0 (the library's documented choice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch


@dataclass(frozen=True)
class BinaryFormat:
    precision: int  # significand bits including the implicit one
    min_normal_exponent: int
    max_exponent: int
    dtype: torch.dtype


BINARY32 = BinaryFormat(24, -126, 127, torch.float32)
BFLOAT16 = BinaryFormat(8, -126, 127, torch.bfloat16)


def round_fraction(value: Fraction, fmt: BinaryFormat = BINARY32) -> float:
    """The value of `fmt` nearest to `value` (ties to even), as a Python float."""
    if value == 0:
        return 0.0
    sign = -1.0 if value < 0 else 1.0
    magnitude = abs(value)
    exponent = _floor_log2(magnitude)
    # The weight of the last kept bit: precision bits below the leading one, but never
    # below the subnormal spacing.
    quantum = max(exponent, fmt.min_normal_exponent) - (fmt.precision - 1)
    scaled = magnitude / Fraction(2) ** quantum
    kept = math.floor(scaled)
    remainder = scaled - kept
    if remainder > Fraction(1, 2) or (remainder == Fraction(1, 2) and kept % 2 == 1):
        kept += 1
    if kept * Fraction(2) ** quantum >= Fraction(2) ** (fmt.max_exponent + 1):
        return sign * math.inf
    return sign * math.ldexp(kept, quantum)


def _floor_log2(magnitude: Fraction) -> int:
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    if Fraction(2) ** (exponent + 1) <= magnitude:
        exponent += 1
    return exponent


def exact_dot(xs, ws) -> float | Fraction:
    """sum(x * w) exactly; a float NaN or +-inf when IEEE rules make the sum special."""
    total, infinities = Fraction(0), set()
    for x, w in zip(xs, ws):
        if math.isnan(x) or math.isnan(w) or (math.isinf(x) and w == 0) or (math.isinf(w) and x == 0):
            return math.nan
        if math.isinf(x) or math.isinf(w):
            infinities.add(math.copysign(1.0, x) * math.copysign(1.0, w))
            continue
        total += Fraction(x) * Fraction(w)
    if len(infinities) == 2:
        return math.nan
    if infinities:
        return infinities.pop() * math.inf
    return total


def oracle_gemm(x: torch.Tensor, w: torch.Tensor, fmt: BinaryFormat = BINARY32) -> torch.Tensor:
    """x @ w.T summed exactly and rounded once into fmt, element by element."""
    xs, ws = x.double().tolist(), w.double().tolist()
    out = [[_rounded(exact_dot(row, col), fmt) for col in ws] for row in xs]
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape[0], w.shape[0]).to(fmt.dtype)


def _rounded(value, fmt: BinaryFormat) -> float:
    return value if isinstance(value, float) else round_fraction(value, fmt)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal as bit patterns (so +0.0 differs from -0.0), treating every NaN alike."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    both_nan = torch.isnan(a) & torch.isnan(b)
    width = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    return bool(((a.view(width) == b.view(width)) | both_nan).all())
