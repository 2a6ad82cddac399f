"""sin and cos with exact argument reduction.

For |x| >= pi/4 the reduction x * 2/pi mod 4 is done on integers (Payne-Hanek): the 24-bit
significand M times a 160-bit window of the bits of 2/pi, chosen by the exponent, gives the
quadrant and 158 fraction bits. The fraction, moved to [-1/2, 1/2), becomes a float64 pair
and is multiplied by pi/2 with an error-free product, so r = x - q pi/2 carries about 90
correct bits even for the inputs closest to a multiple of pi/2.
"""

from sexpgpu.numerics.portable import numpy_ops as K
from sexpgpu.numerics.portable.ieee import (QUIET_NAN, absolute, f32_to_f64, fast_two_sum, horner, near_midpoint, neg,
                                            round_f32, split, two_prod_split)
from sexpgpu.numerics.portable.tables import COS_CASES, SIN_CASES, TWO_OVER_PI, hard_case

PIO2_HI = 1.5707963267948966
PIO2_LO = 6.123233995736766e-17
PIO2_HI_HI, PIO2_HI_LO = split(PIO2_HI)
PIO4 = 0.7853981633974483
WORD = 0xFFFFFFFF
TWO_M51 = 2.0**-51
TWO_M94 = 2.0**-94
SIN_S = (-0.16666666666666666, 0.008333333333333333, -0.0001984126984126984,
         2.7557319223985893e-06, -2.505210838544172e-08, 1.6059043836821613e-10,
         -7.647163731819816e-13, 2.8114572543455206e-15)
COS_C = (0.041666666666666664, -0.001388888888888889, 2.48015873015873e-05,
         -2.755731922398589e-07, 2.08767569878681e-09, -1.1470745597729725e-11,
         4.779477332387385e-14, -1.5619206968586225e-16)


def window_word(tab, j, shift):
    """32 bits of 2/pi starting `shift` bits into table word j (uint64)."""
    a = K.u64(K.gather(tab, j))
    b = K.u64(K.gather(tab, j + 1))
    return ((a << shift) | (b >> (32 - shift))) & WORD


def reduce_large(bits, tab):
    """Quadrant q (int64, 0..3) and r_hi + r_lo = x - q pi/2 for the float32 |x| >= 1/2."""
    w = K.i64(bits)
    exponent = (w >> 23) & 0xFF
    m = K.u64((w & 0x7FFFFF) | 0x800000)
    # the window starts at bit E - 1 of 2/pi, E = exponent - 150; the table starts 31 bits early
    start = K.where(exponent < 126, 126, exponent) - 150 + 30
    j = (start >> 5) + TWO_OVER_PI
    shift = K.u64(start & 31)
    p0 = m * window_word(tab, j, shift)
    p1 = m * window_word(tab, j + 1, shift)
    p2 = m * window_word(tab, j + 2, shift)
    p3 = m * window_word(tab, j + 3, shift)
    p4 = m * window_word(tab, j + 4, shift)
    # limbs of M * window mod 2^160, 32 bits each from 2^32 up; the lowest, p4 & WORD, is
    # below 2^-126 and cannot carry, so it is left out
    limb1 = (p4 >> 32) + (p3 & WORD)
    limb2 = (p3 >> 32) + (p2 & WORD) + (limb1 >> 32)
    limb3 = (p2 >> 32) + (p1 & WORD) + (limb2 >> 32)
    limb4 = ((p1 >> 32) + (p0 & WORD) + (limb3 >> 32)) & WORD
    half = K.i64(limb4 >> 29) & 1
    q = (K.i64(limb4 >> 30) + half) & 3
    top = ((limb4 & 0x3FFFFFFF) << 21) | ((limb3 & WORD) >> 11)
    low = ((limb3 & 0x7FF) << 32) | (limb2 & WORD)
    f_hi, f_lo = fast_two_sum(K.to_f64(top) * TWO_M51 - K.to_f64(half),
                              K.to_f64(low) * TWO_M94)
    r_hi, r_lo = two_prod_split(f_hi, PIO2_HI, PIO2_HI_HI, PIO2_HI_LO)
    r_hi, r_lo = fast_two_sum(r_hi, r_lo + (f_hi * PIO2_LO + f_lo * PIO2_HI))
    return q, r_hi, r_lo


def sin_cos_small(r_hi, r_lo):
    """sin and cos of r_hi + r_lo for |r_hi| <= pi/4, |r_lo| <= 2^-50 |r_hi|."""
    w = r_hi * r_hi
    s = r_hi + (r_hi * w * horner(w, SIN_S) + (r_lo - 0.5 * w * r_lo))
    c = 1.0 + (-0.5 * w + (w * w * horner(w, COS_C) - r_hi * r_lo))
    return s, c


def reduce(bits, tab):
    """|x| as q pi/2 + r: the quadrant q and r_hi + r_lo with |r_hi| <= pi/4."""
    x = f32_to_f64(bits)
    a = absolute(x)
    q, r_hi, r_lo = reduce_large(bits, tab)
    small = a < PIO4
    return x, K.where(small, 0, q), K.where(small, a, r_hi), K.where(small, 0.0, r_lo)


def sin_f32(bits, tab):
    x, q, r_hi, r_lo = reduce(bits, tab)
    s, c = sin_cos_small(r_hi, r_lo)
    y = K.where((q & 1) == 1, c, s)
    y = K.where(((q & 2) == 2) != (x < 0.0), neg(y), y)
    y = K.where(x == 0.0, x, y)
    out = hard_case(bits, round_f32(y, 0.0), near_midpoint(y), tab, SIN_CASES)
    return K.where((x - x) != 0.0, QUIET_NAN, out)


def cos_f32(bits, tab):
    x, q, r_hi, r_lo = reduce(bits, tab)
    s, c = sin_cos_small(r_hi, r_lo)
    y = K.where((q & 1) == 1, s, c)
    y = K.where(((q + 1) & 2) == 2, neg(y), y)
    out = hard_case(bits, round_f32(y, 0.0), near_midpoint(y), tab, COS_CASES)
    return K.where((x - x) != 0.0, QUIET_NAN, out)
