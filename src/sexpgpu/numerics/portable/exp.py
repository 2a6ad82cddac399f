"""exp, expm1, tanh and sigmoid: float64 argument reductions and polynomials.

expm1, tanh, sigmoid (and pow's exponential): x = k ln2 + r with |r| <= ln2/2 + tiny; ln2
is split so that k * LN2_HI is exact and the subtraction x - k * LN2_HI is exact
(Sterbenz), leaving one rounding in r. expm1(r) is r + r^2 q(r) with q the Taylor series
through r^14/14!, whose truncation error is below 2^-63 relative. exp(x) = 2^k (1 + expm1(r))
and expm1(x) = 2^k expm1(r) + (2^k - 1).

exp_f32 makes do with less: t = x 64/ln2 = k + u with k = rint(t), and exp(x) =
2^(k/64) 2^(u/64), 2^(j/64) (j = k mod 64) read from the table and 2^(u/64) - 1 a polynomial
of degree 4 (polynomials.py). Its float64 value errs by up to 2^-46 relative (the rounding of
t, for large |x|), and the few inputs that this error rounds the wrong way are in the
hard-case table (docs/numerics.md).
"""

from sexpgpu.numerics.portable import numpy_ops as K
from sexpgpu.numerics.portable.ieee import (QUIET_NAN, ROUNDING_SHIFT, absolute, f32_to_f64, fast_two_sum, horner,
                                            near_midpoint, neg, pow2, rint, round_f32)
from sexpgpu.numerics.portable.polynomials import EXP_Q
from sexpgpu.numerics.portable.tables import EXP_CASES, EXP_STEPS_AT, EXPM1_CASES, SIGMOID_CASES, TANH_CASES, hard_case

INV_LN2 = 1.4426950408889634
LN2_HI = 0.6931471805598903  # ln 2 to 42 bits: k * LN2_HI is exact for |k| < 2^11
LN2_LO = 5.497923018708371e-14
EXPM1_Q = (0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
           0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05,
           2.7557319223985893e-06, 2.755731922398589e-07, 2.505210838544172e-08,
           2.08767569878681e-09, 1.6059043836821613e-10, 1.1470745597729725e-11)
SERIES_LIMIT = 2.0**-11
SIXTY_FOUR_OVER_LN2 = 92.33248261689366


def exp_reduce(x, x_lo):
    """k (integral float64) and r with x + x_lo = k ln2 + r, for |x| < 700."""
    k = rint(x * INV_LN2)
    return k, ((x - k * LN2_HI) - k * LN2_LO) + x_lo


def expm1_small(r):
    """expm1(r) for |r| <= 0.35."""
    return r + (r * r) * horner(r, EXPM1_Q)


def exp_f64(x, x_lo):
    """exp(x + x_lo) for |x| <= 700 and |x_lo| <= 2^-40."""
    k, r = exp_reduce(x, x_lo)
    return (1.0 + expm1_small(r)) * pow2(K.trunc_i64(k))


def expm1_f64(x):
    """expm1(x) for |x| <= 700."""
    k, r = exp_reduce(x, 0.0)
    p = expm1_small(r)
    scale = pow2(K.trunc_i64(k))
    return K.where(k == 0.0, p, scale * p + (scale - 1.0))


def clamp(x, low, high):
    """x limited to [low, high]; NaN becomes 0 so that integer conversions stay defined."""
    x = K.where(x < low, low, K.where(x > high, high, x))
    return K.where(x == x, x, 0.0)


def clamp_f32(x, bits, low, high):
    """clamp(x, low, high) for x = f32_to_f64(bits), or |x| with the bits of |x|, and bounds
    that are floats32. The GPU build computes it from the bits instead (triton_exact.py)."""
    return clamp(x, low, high)


def finish(bits, invalid, hi, lo, tab, cases):
    """Round hi + lo, apply the hard-case table, and answer NaN where `invalid`."""
    out = hard_case(bits, round_f32(hi, lo), near_midpoint(hi), tab, cases)
    return K.where(invalid, QUIET_NAN, out)


def exp_f32(bits, tab):
    t = clamp_f32(f32_to_f64(bits), bits, -110.0, 100.0) * SIXTY_FOUR_OVER_LN2
    shifted = t + ROUNDING_SHIFT
    k = K.i32(K.f64_bits(shifted))  # rint(t), from the low word of the shifted sum
    u = t - (shifted - ROUNDING_SHIFT)  # exact
    step = K.f64_bits(K.gather_f64(tab, EXP_STEPS_AT + 2 * (k & 63))) + (K.i64(k >> 6) << 52)
    scaled = K.f64_from_bits(step)  # 2^(k/64), a normal float64 for |x| <= 110
    y = scaled + scaled * (u * horner(u, EXP_Q))
    return finish(bits, (bits & 0x7FFFFFFF) > 0x7F800000, y, 0.0, tab, EXP_CASES)


def expm1_f32(bits, tab):
    x = f32_to_f64(bits)
    y = expm1_f64(clamp_f32(x, bits, -110.0, 100.0))
    return finish(bits, x != x, K.where(x == 0.0, x, y), 0.0, tab, EXPM1_CASES)


def tanh_f32(bits, tab):
    x = f32_to_f64(bits)
    a = clamp_f32(absolute(x), bits & 0x7FFFFFFF, 0.0, 20.0)
    t = expm1_f64(a + a)
    y = t / (t + 2.0)
    y = K.where(x < 0.0, neg(y), K.where(x == 0.0, x, y))
    return finish(bits, x != x, y, 0.0, tab, TANH_CASES)


def sigmoid_f32(bits, tab):
    """1 / (1 + exp(-x)); near 0 it is 1/2 + x/4 - x^3/48 + ..., rounded from hi + lo."""
    x = f32_to_f64(bits)
    a = clamp_f32(absolute(x), bits & 0x7FFFFFFF, 0.0, 110.0)
    e = exp_f64(neg(a), 0.0)
    y = K.where(x < 0.0, e, 1.0) / (1.0 + e)
    # |x| < 2^-11: 1/2 + x/4 lies within x^3/48 of sigmoid(x) and no float32 or rounding
    # midpoint lies strictly between them, so -x^3/48 only breaks ties (docs/numerics.md)
    s = clamp_f32(x, bits, -SERIES_LIMIT, SERIES_LIMIT)
    hi, lo = fast_two_sum(0.5 + 0.25 * s, (s * s * s) / -48.0)
    near_zero = (x < SERIES_LIMIT) & (x > -SERIES_LIMIT)
    return finish(bits, x != x, K.where(near_zero, hi, y), K.where(near_zero, lo, 0.0), tab,
                  SIGMOID_CASES)
