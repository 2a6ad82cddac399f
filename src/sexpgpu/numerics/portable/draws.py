"""Draws: each element is a function of the Philox block of its own counter.

Element i (C order) under key (k0, k1) reads the block philox4x32((i mod 2^32, i >> 32,
attempt, 0), (k0, k1)), words w0..w3; attempt is 0 except in truncated normals. Each
distribution's use of the words is documented in docs/numerics.md.
"""

from . import numpy_ops as K
from .ieee import f32_to_f64, neg, round_f32
from .log import log_f64
from .philox import philox4x32
from .trig import sin_cos_small

TWO_M24 = 2.0**-24
TWO_M53 = 2.0**-53
TURN_UNIT = 1.4629180792671596e-09  # pi 2^-31: 2^-32 of a turn, in radians
QUARTER = 0x40000000
EIGHTH = 0x20000000


def block(i_lo, i_hi, attempt, k0, k1):
    zero = i_lo ^ i_lo
    return philox4x32(i_lo, i_hi, zero + attempt, zero, k0, k1)


def inside(bits, low, high, low_cap, high_cap):
    """float32 bits moved into [low, high): to low_cap below low, to high_cap from high."""
    x = f32_to_f64(bits)
    return K.where(x < low, low_cap, K.where(x >= high, high_cap, bits))


def uniform_f32(i_lo, i_hi, k0, k1, low, high, low_cap, high_cap):
    """low + (high - low) u with u = (w0 >> 8) 2^-24, rounded to float32."""
    w0, w1, w2, w3 = block(i_lo, i_hi, 0, k0, k1)
    u = K.to_f64(w0 >> 8) * TWO_M24
    return inside(round_f32(low + (high - low) * u, 0.0), low, high, low_cap, high_cap)


def standard_normal(w0, w1, w2):
    """Box-Muller: sqrt(-2 log u1) cos(theta), u1 in (0, 1] from 53 bits of w0 w1, theta
    the angle w2 2^-32 turns, reduced exactly to a quadrant and |r| <= pi/4."""
    u1 = (K.to_f64((K.u64(w0) << 21) | K.u64(w1 >> 11)) + 1.0) * TWO_M53
    radius = K.sqrt(-2.0 * log_f64(u1))
    turn = K.i64(w2) + EIGHTH
    quadrant = (turn >> 30) & 3
    s, c = sin_cos_small(K.to_f64((turn & (QUARTER - 1)) - EIGHTH) * TURN_UNIT, 0.0)
    cosine = K.where((quadrant & 1) == 1, s, c)
    return radius * K.where(((quadrant + 1) & 2) == 2, neg(cosine), cosine)


def normal_attempt(i_lo, i_hi, attempt, k0, k1):
    w0, w1, w2, w3 = block(i_lo, i_hi, attempt, k0, k1)
    return standard_normal(w0, w1, w2)


def scaled_f32(z, mean, std):
    return round_f32(mean + std * z, 0.0)


def bernoulli(i_lo, i_hi, k0, k1, threshold):
    """True where w0 < threshold, threshold = round(p 2^32)."""
    w0, w1, w2, w3 = block(i_lo, i_hi, 0, k0, k1)
    return K.u64(w0) < threshold


def randint_i32(i_lo, i_hi, k0, k1, low, span):
    """low + floor(u span) with u = (w0 2^32 + w1) 2^-64, span = high - low <= 2^32."""
    w0, w1, w2, w3 = block(i_lo, i_hi, 0, k0, k1)
    scaled = (K.u64(w0) * span + ((K.u64(w1) * span) >> 32)) >> 32
    return K.i32(K.i64(scaled) + low)
