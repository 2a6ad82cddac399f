"""log and log1p in float64, and log as a float64 pair for pow.

u = 2^e m with m in [sqrt(1/2), sqrt(2)); f = (m - 1)/(m + 1) and
log m = 2 atanh f = 2f + f w S(w), w = f^2, with S the series 2/3 + 2w/5 + ... through
2 w^10/23 (truncation below 2^-61 relative, as |f| <= 0.1716).
"""

from sexpgpu.numerics.portable import numpy_ops as K
from sexpgpu.numerics.portable.exp import LN2_HI, LN2_LO
from sexpgpu.numerics.portable.ieee import (QUIET_NAN, f32_to_f64, fast_two_sum, horner, near_midpoint, round_f32,
                                            two_prod, two_sum)
from sexpgpu.numerics.portable.tables import LOG1P_CASES, LOG_CASES, hard_case

SQRT2_FRACTION = 0x6A09E667F3BCD  # the 52 fraction bits of sqrt(2)
FRACTION = 0xFFFFFFFFFFFFF
LOG_S = (0.6666666666666666, 0.4, 0.2857142857142857, 0.2222222222222222,
         0.18181818181818182, 0.15384615384615385, 0.13333333333333333,
         0.11764705882352941, 0.10526315789473684, 0.09523809523809523,
         0.08695652173913043)
NEG_INF = 0xFF800000
POS_INF = 0x7F800000


def log_parts(u):
    """e (integral float64) and m in [sqrt(1/2), sqrt(2)) with u = 2^e m, u normal."""
    b = K.f64_bits(u)
    frac = b & FRACTION
    big = frac > SQRT2_FRACTION
    e = ((b >> 52) & 0x7FF) - 1023 + K.i64(big)
    m = K.f64_from_bits(frac | K.where(big, 1022 << 52, 1023 << 52))
    return K.to_f64(e), m


def log_f64(u):
    """log u for a normal positive float64 u."""
    e, m = log_parts(u)
    f = (m - 1.0) / (m + 1.0)
    w = f * f
    return e * LN2_HI + (2.0 * f + (f * w * horner(w, LOG_S) + e * LN2_LO))


def log_pair(u):
    """log u as hi + lo, about 2^-58 relative, for u with a 24-bit significand."""
    e, m = log_parts(u)
    t = m + 1.0  # exact: m has 24 significant bits
    f = (m - 1.0) / t
    p, p_err = two_prod(f, t)
    f_lo = (((m - 1.0) - p) - p_err) / t
    w = f * f
    s_hi, s_lo = two_sum(e * LN2_HI, 2.0 * f)
    lo = s_lo + (2.0 * f_lo + (f * w * horner(w, LOG_S) + e * LN2_LO))
    return fast_two_sum(s_hi, lo)


def log_f32(bits, tab):
    x = f32_to_f64(bits)
    finite = (x > 0.0) & (x - x == 0.0)
    y = log_f64(K.where(finite, x, 1.0))
    out = hard_case(bits, round_f32(y, 0.0), near_midpoint(y), tab, LOG_CASES)
    out = K.where(x == 0.0, NEG_INF, K.where(x > 1.0e39, POS_INF, out))
    return K.where((x < 0.0) | (x != x), QUIET_NAN, out)


def log1p_f32(bits, tab):
    """log(u) + u_err/u where u + u_err = 1 + x exactly."""
    x = f32_to_f64(bits)
    u, u_err = two_sum(1.0, x)
    finite = (x > -1.0) & (x - x == 0.0)
    u = K.where(finite, u, 1.0)
    y = log_f64(u) + K.where(finite, u_err, 0.0) / u
    y = K.where(x == 0.0, x, y)
    out = hard_case(bits, round_f32(y, 0.0), near_midpoint(y), tab, LOG1P_CASES)
    out = K.where(x == -1.0, NEG_INF, K.where(x > 1.0e39, POS_INF, out))
    return K.where((x < -1.0) | (x != x), QUIET_NAN, out)
