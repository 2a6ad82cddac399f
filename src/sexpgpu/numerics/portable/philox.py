"""Philox4x32-10 (Salmon, Moraes, Dror and Shaw, SC'11), as in Random123.

Words are uint32. Each round multiplies counter words 0 and 2 by fixed constants, mixes
the high and low halves with words 1 and 3 and the key, and bumps the key by the Weyl
constants; ten rounds make one output block.
"""

from sexpgpu.numerics.portable import numpy_ops as K

MUL0 = 0xD2511F53
MUL1 = 0xCD9E8D57
WEYL0 = 0x9E3779B9
WEYL1 = 0xBB67AE85
FOLD_COUNTER_WORD3 = 1  # draws use counter word 3 = 0; fold_in uses 1, so a salt touches no draw's block


def philox_round(c0, c1, c2, c3, k0, k1):
    hi0 = K.umulhi(c0, MUL0)
    lo0 = c0 * MUL0
    hi1 = K.umulhi(c2, MUL1)
    lo1 = c2 * MUL1
    return hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0


def philox4x32(c0, c1, c2, c3, k0, k1):
    """The four output words for counter (c0, c1, c2, c3) under key (k0, k1)."""
    for _ in K.static_range(9):
        c0, c1, c2, c3 = philox_round(c0, c1, c2, c3, k0, k1)
        k0 = k0 + WEYL0
        k1 = k1 + WEYL1
    return philox_round(c0, c1, c2, c3, k0, k1)


def fold_in_words(v_lo, v_hi, k0, k1):
    """The key words fold_in gives for the salt v = v_hi 2^32 + v_lo under key (k0, k1):
    words 0 and 1 of the block with counter (v_lo, v_hi, 0, 1)."""
    zero = v_lo ^ v_lo
    w0, w1, _, _ = philox4x32(v_lo, v_hi, zero, zero + FOLD_COUNTER_WORD3, k0, k1)
    return w0, w1
