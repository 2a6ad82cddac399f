"""float32 <-> float64 conversions done in integer arithmetic, and error-free float64 sums.

Conversions go through the bit patterns so that no device's flush-to-zero or conversion
instruction can change a subnormal: every float32 is exactly a float64, and a float64 is
rounded to float32 once, to nearest even.
"""

from sexpgpu.numerics.portable import numpy_ops as K

QUIET_NAN = 0x7FC00000
INFINITY = 0x7F800000
MIN_NORMAL_F64_BITS = 897 << 52  # 2^-126
MIN_NORMAL_F64_HIGH = 897 << 20  # the high word of MIN_NORMAL_F64_BITS
SUBNORMAL_NEAR_FLOOR_F64_HIGH = 872 << 20  # the high word of 2^-151, below the least midpoint
MIDPOINT_REST = 0x10000000  # the 29 bits a float64 drops for float32 at a rounding midpoint
# Distance, in float64 ulps, within which near_midpoint flags a value. It has to exceed the
# error of every float64 evaluation whose hard-case table holds the inputs it rounds the
# wrong way: below 3 ulps for most, about 2^7 for exp and 2^12.5 for erf (docs/numerics.md).
# A wide one costs nothing but an occasional table read.
NEAR_MIDPOINT_ULPS = 1 << 16
TWO_M149 = 2.0**-149
TWO_P149 = 2.0**149
SPLITTER = 134217729.0  # 2^27 + 1
ROUNDING_SHIFT = 6755399441055744.0  # 1.5 2^52: x + it is rint(x) + it, for |x| < 2^51


def neg(x):
    """-x, exactly, with the sign of zero (Triton's unary minus computes 0 - x, so -(+0) = +0)."""
    return x * -1.0


def absolute(x):
    """|x| for float64, by clearing the sign bit."""
    return K.f64_from_bits(K.f64_bits(x) & 0x7FFFFFFFFFFFFFFF)


def with_sign(y, bits):
    """y (not negative) with the sign of the float32 of these bits, by its sign bit."""
    return K.f64_from_bits(K.f64_bits(y) | (K.i64(bits >> 31) << 63))


def f32_to_f64(bits):
    """The float64 equal to the float32 with these bits (uint32)."""
    w = K.i64(bits)
    e = (w >> 23) & 0xFF
    m = w & 0x7FFFFF
    normal = K.f64_from_bits(((e + 896) << 52) | (m << 29))
    special = K.f64_from_bits((2047 << 52) | (m << 29))
    tiny = K.to_f64(m) * TWO_M149
    v = K.where(e == 0, tiny, K.where(e == 255, special, normal))
    return K.where((w >> 31) == 1, neg(v), v)


def round_f32(hi, lo):
    """float32 bits (uint32) of hi + lo rounded to nearest even, NaN as 0x7FC00000.

    Requires |lo| <= ulp(hi) / 2, so that lo only decides where hi is exactly halfway
    between two floats32 (or exactly one of them, where lo cannot move it).
    """
    hb = K.f64_bits(hi)
    sign = (hb >> 63) & 1
    mag = hb & 0x7FFFFFFFFFFFFFFF
    beyond = (lo != 0.0) & ((lo > 0.0) == (hi > 0.0))
    short = (lo != 0.0) & ((lo > 0.0) != (hi > 0.0))
    kept = mag >> 29
    rest = mag & 0x1FFFFFFF
    up = (rest > 0x10000000) | ((rest == 0x10000000) & (beyond | (~short & ((kept & 1) == 1))))
    normal = kept + K.i64(up) - (896 << 23)
    normal = K.where(normal >= INFINITY, INFINITY, normal)
    small = mag < MIN_NORMAL_F64_BITS
    scaled = K.where(small, K.f64_from_bits(mag) * TWO_P149, 0.0)
    units = K.trunc_i64(scaled)
    frac = scaled - K.to_f64(units)
    up_small = (frac > 0.5) | ((frac == 0.5) & (beyond | (~short & ((units & 1) == 1))))
    result = K.where(small, units + K.i64(up_small), normal) | (sign << 31)
    return K.u32(K.where(mag > (2047 << 52), QUIET_NAN, result))


def near_midpoint(y):
    """Whether rounding the float64 y to float32 might differ from rounding the exact value
    that y approximates: y within NEAR_MIDPOINT_ULPS float64 ulps of a float32 rounding
    midpoint, or y in [2^-151, 2^-126) (all flagged: there the midpoints are spaced by a
    fixed 2^-149, not by the 29 dropped bits). Looks at y's bits only, so that it is the
    same test on every device."""
    b = K.f64_bits(y)
    high = K.i32(b >> 32) & 0x7FFFFFFF
    rest = K.i32(b & 0x1FFFFFFF)
    normal_near = ((rest > MIDPOINT_REST - NEAR_MIDPOINT_ULPS)
                   & (rest < MIDPOINT_REST + NEAR_MIDPOINT_ULPS))
    subnormal = high < MIN_NORMAL_F64_HIGH
    return K.where(subnormal, high >= SUBNORMAL_NEAR_FLOOR_F64_HIGH, normal_near)


def two_sum(a, b):
    """s, e with s = fl(a + b) and s + e = a + b exactly."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fast_two_sum(a, b):
    """two_sum for |a| >= |b| (or a == 0)."""
    s = a + b
    return s, b - (s - a)


def split(a):
    """a = hi + lo with hi and lo of at most 26 significant bits (Veltkamp)."""
    c = a * SPLITTER
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b):
    """p, e with p = fl(a * b) and p + e = a * b exactly (no fused multiply-add)."""
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def two_prod_split(a, b, b_hi, b_lo):
    """two_prod(a, b) for a constant b whose split(b) = (b_hi, b_lo) is precomputed."""
    p = a * b
    ah, al = split(a)
    return p, ((ah * b_hi - p) + ah * b_lo + al * b_hi) + al * b_lo


def pow2(k):
    """2^k as float64 for an int64 k in [-1022, 1023]."""
    return K.f64_from_bits((k + 1023) << 52)


def rint(x):
    """x rounded to the nearest integer (ties to even), for |x| < 2^51, as float64."""
    return (x + ROUNDING_SHIFT) - ROUNDING_SHIFT


def horner(x, coefs):
    """coefs[0] + coefs[1] x + ... + coefs[-1] x^(n-1), n >= 2, by Horner's rule."""
    p = x * coefs[len(coefs) - 1] + coefs[len(coefs) - 2]
    for i in K.static_range(len(coefs) - 2):
        p = p * x + coefs[len(coefs) - 3 - i]
    return p


def horner_table(x, tab, first, stride, count):
    """c_0 + c_1 x + ... + c_(count-1) x^(count-1) by Horner's rule, count >= 2, c_j the
    float64 of tab at word first + j stride: coefficients chosen per element by `first`."""
    p = x * K.gather_f64(tab, first + stride * (count - 1)) + K.gather_f64(tab, first + stride * (count - 2))
    for i in K.static_range(count - 2):
        p = p * x + K.gather_f64(tab, first + stride * (count - 3 - i))
    return p
