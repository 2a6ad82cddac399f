"""pow(x, y) for float32 x and y: exp(y log|x|) with the logarithm as a float64 pair.

z = y log|x| is formed with an error-free product, so its absolute error is about
|z| 2^-58; exp(z) then carries a relative error of a few float64 ulps. The special values
follow C99 Annex F (IEEE 754 pow). y = 2, 1/2, 1 and -1 are computed exactly as x*x,
sqrt(x), x and 1/x, each correctly rounded.
"""

from sexpgpu.numerics.portable import numpy_ops as K
from sexpgpu.numerics.portable.exp import exp_f64
from sexpgpu.numerics.portable.ieee import QUIET_NAN, absolute, f32_to_f64, fast_two_sum, neg, round_f32, two_prod
from sexpgpu.numerics.portable.log import log_pair

TWO_P24 = 16777216.0
INF = float("inf")


def integral_and_odd(y, ay):
    """Whether the finite float32 y is an integer, and whether it is an odd one."""
    finite = ay - ay == 0.0
    small = K.where(ay < TWO_P24, y, 0.0)
    n = K.trunc_i64(small)
    exact = K.to_f64(n) == small
    return finite & (exact | (ay >= TWO_P24)), finite & exact & ((n & 1) == 1)


def magnitude(ax, y):
    """|x|^y in float64 for finite nonzero |x| and finite y."""
    safe_x = K.where((ax > 0.0) & (ax - ax == 0.0), ax, 1.0)
    safe_y = K.where(y - y == 0.0, y, 0.0)
    l_hi, l_lo = log_pair(safe_x)
    z_hi, z_lo = two_prod(safe_y, l_hi)
    z_hi, z_lo = fast_two_sum(z_hi, z_lo + safe_y * l_lo)
    outside = (z_hi > 200.0) | (z_hi < -200.0)
    z_hi = K.where(z_hi > 200.0, 200.0, K.where(z_hi < -200.0, -200.0, z_hi))
    general = exp_f64(z_hi, K.where(outside, 0.0, z_lo))
    exact = K.where(y == 2.0, safe_x * safe_x,
                    K.where(y == 0.5, K.sqrt(safe_x), 1.0 / safe_x))
    return K.where((y == 2.0) | (y == 0.5) | (y == -1.0), exact,
                   K.where(y == 1.0, safe_x, general))


def special_magnitude(ax, y, general):
    """|x|^y where x is 0 or infinite or y is infinite; `general` elsewhere."""
    ay = absolute(y)
    towards_zero = ((ax < 1.0) == (y > 0.0)) & (ax != 1.0)
    y_inf = K.where(ax == 1.0, 1.0, K.where(towards_zero, 0.0, INF))
    x_zero = K.where(y < 0.0, INF, 0.0)
    x_inf = K.where(y < 0.0, 0.0, INF)
    out = K.where(ax == 0.0, x_zero, K.where(ax == INF, x_inf, general))
    return K.where(ay == INF, y_inf, out)


def pow_f32(x_bits, y_bits, tab):
    x = f32_to_f64(x_bits)
    y = f32_to_f64(y_bits)
    ax = absolute(x)
    ay = absolute(y)
    integral, odd = integral_and_odd(y, ay)
    x_negative = x_bits > 0x7FFFFFFF
    mag = special_magnitude(ax, y, magnitude(ax, y))
    out = round_f32(K.where(x_negative & odd, neg(mag), mag), 0.0)
    finite_x = (ax > 0.0) & (ax < INF)
    invalid = (x != x) | (y != y) | (x_negative & finite_x & (ay < INF) & ~integral)
    out = K.where(invalid, QUIET_NAN, out)
    return K.where((y == 0.0) | (x == 1.0), 0x3F800000, out)
