"""Draws: elements read the words of Philox blocks, several elements to a block.

Block b under key (k0, k1) is philox4x32((b mod 2^32, b >> 32, attempt, 0), (k0, k1)),
words w0..w3; attempt is 0 except in truncated normals. Element i (C order) of a uniform
or bernoulli draw reads word i mod 4 of block i div 4; of a normal or randint draw, half of
block i div 2 (docs/numerics.md). Each function here takes the block numbers of its lanes
and returns the elements of those blocks, in element order.
"""

from sexpgpu.numerics.portable import numpy_ops as K
from sexpgpu.numerics.portable.ieee import f32_to_f64, neg, round_f32
from sexpgpu.numerics.portable.log import log_f64
from sexpgpu.numerics.portable.philox import philox4x32
from sexpgpu.numerics.portable.trig import sin_cos_small

TWO_M24 = 2.0**-24
TWO_M53 = 2.0**-53
TURN_UNIT = 1.4629180792671596e-09  # pi 2^-31: 2^-32 of a turn, in radians
QUARTER = 0x40000000
EIGHTH = 0x20000000


def block(b_lo, b_hi, attempt, k0, k1):
    zero = b_lo ^ b_lo
    return philox4x32(b_lo, b_hi, zero + attempt, zero, k0, k1)


def in_order(e0, e1, e2, e3):
    """The elements of four lanes' words, word by word: e0[0], e1[0], e2[0], e3[0], e0[1]..."""
    return K.interleave(K.interleave(e0, e2), K.interleave(e1, e3))


def inside(bits, low, high, low_cap, high_cap):
    """float32 bits moved into [low, high): to low_cap below low, to high_cap from high."""
    x = f32_to_f64(bits)
    return K.where(x < low, low_cap, K.where(x >= high, high_cap, bits))


def uniform_word(w, low, high, low_cap, high_cap):
    """low + (high - low) u with u = (w >> 8) 2^-24, rounded to float32."""
    u = K.to_f64(w >> 8) * TWO_M24
    return inside(round_f32(low + (high - low) * u, 0.0), low, high, low_cap, high_cap)


def uniform_f32(b_lo, b_hi, k0, k1, low, high, low_cap, high_cap):
    w0, w1, w2, w3 = block(b_lo, b_hi, 0, k0, k1)
    return in_order(uniform_word(w0, low, high, low_cap, high_cap),
                    uniform_word(w1, low, high, low_cap, high_cap),
                    uniform_word(w2, low, high, low_cap, high_cap),
                    uniform_word(w3, low, high, low_cap, high_cap))


def bernoulli(b_lo, b_hi, k0, k1, threshold):
    """True where the word is below threshold = round(p 2^32)."""
    w0, w1, w2, w3 = block(b_lo, b_hi, 0, k0, k1)
    return in_order(K.u64(w0) < threshold, K.u64(w1) < threshold, K.u64(w2) < threshold,
                    K.u64(w3) < threshold)


def randint_pair(high_word, low_word, low, span):
    """low + floor(u span), u = (high_word 2^32 + low_word) 2^-64, span <= 2^32."""
    scaled = (K.u64(high_word) * span + ((K.u64(low_word) * span) >> 32)) >> 32
    return K.i32(K.i64(scaled) + low)


def randint_i32(b_lo, b_hi, k0, k1, low, span):
    w0, w1, w2, w3 = block(b_lo, b_hi, 0, k0, k1)
    return K.interleave(randint_pair(w0, w1, low, span), randint_pair(w2, w3, low, span))


def normal_pair(b_lo, b_hi, attempt, k0, k1):
    """Box-Muller: r cos(theta) and r sin(theta), r = sqrt(-2 log u1), u1 in (0, 1] from 53
    bits of w0 w1, theta the angle w2 2^-32 turns, reduced exactly to a quadrant and
    |t| <= pi/4."""
    w0, w1, w2, w3 = block(b_lo, b_hi, attempt, k0, k1)
    u1 = (K.to_f64((K.u64(w0) << 21) | K.u64(w1 >> 11)) + 1.0) * TWO_M53
    radius = K.sqrt(-2.0 * log_f64(u1))
    turn = K.i64(w2) + EIGHTH
    quadrant = (turn >> 30) & 3
    s, c = sin_cos_small(K.to_f64((turn & (QUARTER - 1)) - EIGHTH) * TURN_UNIT, 0.0)
    odd = (quadrant & 1) == 1
    cosine = K.where(odd, s, c)
    sine = K.where(odd, c, s)
    cosine = K.where(((quadrant + 1) & 2) == 2, neg(cosine), cosine)
    sine = K.where((quadrant & 2) == 2, neg(sine), sine)
    return radius * cosine, radius * sine


def scaled_f32(z, mean, std):
    return round_f32(mean + std * z, 0.0)


def normal_f32(b_lo, b_hi, k0, k1, mean, std):
    z0, z1 = normal_pair(b_lo, b_hi, 0, k0, k1)
    return scaled_f32(K.interleave(z0, z1), mean, std)
