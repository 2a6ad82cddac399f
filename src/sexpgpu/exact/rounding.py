"""Rounding an accumulator once, to nearest with ties to even, into float32 or bfloat16.

The rounding reads the exact value's bits: the position P of its highest set bit, the
kept bits above q = max(P - (precision - 1), lowest subnormal bit), the bit just below
q and whether anything below that is set. Values from 2**128 up become infinities, values
below the smallest subnormal round to zero or to it, and only an exact zero is +0.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import implementations
from .accumulator import normalise_digits_
from .layout import DIGITS, LOWEST_DIGIT_EXPONENT, NAN_PLANE, NEG_INF_PLANE, POS_INF_PLANE, RADIX_BITS, TOP


@dataclass(frozen=True)
class Format:
    precision: int  # significand bits, the implicit one included
    lowest_exponent: int  # the weight of the smallest subnormal's bit
    overflow_exponent: int = 128  # the smallest power of two that is not finite


FORMATS = {torch.float32: Format(24, -149), torch.bfloat16: Format(8, -133)}


def round_planes(planes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(WIDTH, *S) normalised planes -> the correctly rounded values, a tensor of shape S. Into
    float32 on the device paths, one kernel that reads nothing back (queued_kernels._round_planes)."""
    if dtype == torch.float32 and implementations.on_device(planes.device) and planes[0].numel():
        from .queued_kernels import PLANES_BLOCK, _round_planes  # Triton is imported only where it runs

        outputs = planes[0].numel()
        result = torch.empty(planes.shape[1:], dtype=torch.float32, device=planes.device)
        _round_planes[(-(-outputs // PLANES_BLOCK),)](planes.contiguous(), result, outputs, BLOCK=PLANES_BLOCK,
                                                    num_warps=4, enable_fp_fusion=False)
        return result
    digits = planes[:DIGITS]
    negative = digits[TOP] < 0
    magnitude = normalise_digits_(torch.where(negative, -digits, digits))
    value = _round_magnitude(magnitude, FORMATS[dtype])
    value = torch.where(negative, -value, value).to(dtype)
    return _apply_special(value, planes)


def _round_magnitude(magnitude: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Non-negative normalised digits -> float64 holding the rounded magnitude (or inf)."""
    top_bit = _highest_bit(magnitude)
    lowest_kept = (top_bit - (fmt.precision - 1)).clamp(min=fmt.lowest_exponent - LOWEST_DIGIT_EXPONENT)
    kept = _bits_from(magnitude, lowest_kept)
    round_bit = _bit_at(magnitude, lowest_kept - 1)
    sticky = _any_bit_below(magnitude, lowest_kept - 1)
    kept = kept + (round_bit & (sticky | (kept & 1)))
    rounded = kept.to(torch.float64) * power_of_two(lowest_kept + LOWEST_DIGIT_EXPONENT)
    overflow = top_bit >= fmt.overflow_exponent - LOWEST_DIGIT_EXPONENT
    return torch.where(overflow, torch.full_like(rounded, float("inf")), rounded)


def _highest_bit(digits: torch.Tensor) -> torch.Tensor:
    """The position of the highest set bit (counted from the lowest digit's bit 0); -1 for zero."""
    index = torch.arange(DIGITS, device=digits.device).view(-1, *([1] * (digits.dim() - 1)))
    highest_digit = torch.where(digits != 0, index, -1).amax(0)
    top = _digit(digits, highest_digit.clamp(min=0))
    # frexp gives the bit length; digits other than the top are below 2**32 and exact in fp64,
    # and a top digit too large for that means an overflow whatever the last bits.
    bit_length = torch.frexp(top.to(torch.float64)).exponent.to(torch.int64)
    return torch.where(highest_digit < 0, -1, RADIX_BITS * highest_digit + bit_length - 1)


def _digit(digits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """digits[index[...], ...], zero where index is past the top."""
    inside = index < DIGITS
    picked = torch.gather(digits, 0, index.clamp(max=DIGITS - 1).unsqueeze(0)).squeeze(0)
    return torch.where(inside, picked, 0)


def _bits_from(digits: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The value's bits at `position` and above, as an integer (fewer than 56 of them are set)."""
    index, shift = position >> 5, position & (RADIX_BITS - 1)
    low, high = _digit(digits, index), _digit(digits, index + 1)
    return ((high << RADIX_BITS) | low) >> shift


def _bit_at(digits: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    return (_digit(digits, position >> 5) >> (position & (RADIX_BITS - 1))) & 1


def _any_bit_below(digits: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    index, shift = position >> 5, position & (RADIX_BITS - 1)
    in_digit = (_digit(digits, index) & ((torch.ones_like(shift) << shift) - 1)) != 0
    nonzero_so_far = torch.cumsum((digits != 0).to(torch.int64), 0)
    below = torch.gather(nonzero_so_far, 0, (index - 1).clamp(min=0).unsqueeze(0)).squeeze(0)
    return (in_digit | ((index > 0) & (below > 0))).to(torch.int64)


def power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """2.0**exponent, exactly, for normal fp64 exponents: built from its bits."""
    return ((exponent + 1023) << 52).view(torch.float64)


def _apply_special(value: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    return apply_special_counts(value, planes[NAN_PLANE:])


def apply_special_counts(value: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The rounded finite sums, overridden where (3, ...) counts of NaN, +inf, -inf products say so."""
    pos_inf, neg_inf = counts[POS_INF_PLANE - NAN_PLANE] > 0, counts[NEG_INF_PLANE - NAN_PLANE] > 0
    nan = (counts[0] > 0) | (pos_inf & neg_inf)
    value = torch.where(pos_inf, torch.full_like(value, float("inf")), value)
    value = torch.where(neg_inf, torch.full_like(value, float("-inf")), value)
    return torch.where(nan, torch.full_like(value, float("nan")), value)
