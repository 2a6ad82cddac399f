"""The one uint32 table the portable algorithms read: bits of 2/pi, hard-case answers, and
float64 values that exp and erf choose per element (polynomials.py).

Hard cases sit in open-addressing-free hash tables: slot = (bits * multiplier mod 2^32)
>> shift, with a multiplier chosen here (deterministically) so that no two keys share a
slot. Each slot holds (key, answer); empty slots hold the key 0xFFFFFFFF, a NaN, whose
answer is replaced by NaN anyway. Even and odd functions are keyed by |x| and hold the
answer for |x|; an odd function's answer takes the sign of x. Each function's table is
described to the algorithms by the constant (offset, multiplier, shift, key mask, sign mask).

A float64 is stored as its two little-endian words at an even offset, which K.gather_f64
reads as one aligned 8-byte load. erf's coefficients are stored by degree: coefficient j of
every piece, then coefficient j + 1, so that one read of coefficient j spans few cache lines
whatever the pieces of a warp's lanes.
"""

import numpy as np

from sexpgpu.numerics.portable import numpy_ops as K
from sexpgpu.numerics.portable import polynomials
from sexpgpu.numerics.portable.hardcases import HARD_CASES

# 2/pi = 0.A2F9836E 4E441529 ... in hex; one zero word in front so that windows of bits
# starting before the binary point read zeros
TWO_OVER_PI_BITS = (0x00000000, 0xA2F9836E, 0x4E441529, 0xFC2757D1, 0xF534DDC0, 0xDB629599,
                    0x3C439041, 0xFE5163AB, 0xDEBBC561, 0xB7246E3A, 0x424DD2E0, 0x06492EEA)
EMPTY = 0xFFFFFFFF
EVEN = ("cos",)
ODD = ("erf", "sin", "tanh")
# The first attempt of _slots whose multiplier is collision-free for each function's cases.
# The search from attempt 1 takes about a second in Python (log1p's is attempt 72,681), and
# every process that imports the numerics paid it; starting at the recorded attempt builds
# the same table at once. test_tables.py checks that each is still the first.
FIRST_FREE_ATTEMPT = {"cos": 27, "erf": 21, "exp": 12, "expm1": 14, "log": 9812, "log1p": 72681, "rsqrt": 1,
                      "sigmoid": 2, "sin": 4050, "tanh": 1}


def _slots(cases, first_attempt: int = 1):
    """(multiplier, shift, slot words) of a collision-free hash table for `cases`: the first
    such multiplier from `first_attempt` on."""
    size_log = max(4, (2 * len(cases) - 1).bit_length())
    shift = 32 - size_log
    for attempt in range(first_attempt, 1 << 20):
        multiplier = (0x9E3779B1 * (2 * attempt + 1)) & 0xFFFFFFFF | 0x80000001
        slots = [(EMPTY, 0)] * (1 << size_log)
        for key in sorted(cases):
            slot = ((key * multiplier) & 0xFFFFFFFF) >> shift
            if slots[slot][0] != EMPTY:
                break
            slots[slot] = (key, cases[key])
        else:
            return multiplier, shift, [w for pair in slots for w in pair]
    raise AssertionError("no collision-free multiplier")


def _float64_words(values):
    return np.array(values, dtype="<f8").view("<u4").astype(np.uint32).tolist()


FLOAT64_BLOCKS = {
    "exp_steps": polynomials.EXP_STEPS,
    "erf_coefficients": tuple(c for j in range(len(polynomials.ERF_COEFFICIENTS[0]))
                              for c in (piece[j] for piece in polynomials.ERF_COEFFICIENTS)),
}


def _build():
    words = list(TWO_OVER_PI_BITS)
    specs = {}
    for name in sorted(HARD_CASES):
        assert len(words) % 2 == 0, "K.gather_pair_if reads a slot as one aligned 8-byte word"
        multiplier, shift, slot_words = _slots(HARD_CASES[name], FIRST_FREE_ATTEMPT.get(name, 1))
        key_mask = 0x7FFFFFFF if name in EVEN + ODD else 0xFFFFFFFF
        sign_mask = 0x80000000 if name in ODD else 0
        specs[name] = (len(words), multiplier, shift, key_mask, sign_mask)
        words.extend(slot_words)
    for name, values in FLOAT64_BLOCKS.items():
        assert len(words) % 2 == 0, "K.gather_f64 reads a float64 as one aligned 8-byte word"
        specs[name] = len(words)
        words.extend(_float64_words(values))
    return np.array(words, dtype=np.uint32), specs


TABLE, _SPECS = _build()
EXP_STEPS_AT = _SPECS["exp_steps"]
ERF_COEFFICIENTS_AT = _SPECS["erf_coefficients"]
ERF_PIECES = len(polynomials.ERF_COEFFICIENTS)
ERF_COEFFICIENT_COUNT = len(polynomials.ERF_COEFFICIENTS[0])
TWO_OVER_PI = 0
EXP_CASES = _SPECS["exp"]
EXPM1_CASES = _SPECS["expm1"]
LOG_CASES = _SPECS["log"]
LOG1P_CASES = _SPECS["log1p"]
TANH_CASES = _SPECS["tanh"]
SIGMOID_CASES = _SPECS["sigmoid"]
ERF_CASES = _SPECS["erf"]
COS_CASES = _SPECS["cos"]
SIN_CASES = _SPECS["sin"]
RSQRT_CASES = _SPECS["rsqrt"]


def hard_case(bits, result, near, tab, spec):
    """The table's answer where `bits` is one of the function's hard cases and `near`
    (ieee.near_midpoint of the float64 value rounded to `result`), else `result`.

    Only `near` lanes read the table (on a GPU the others issue no memory access). That
    keeps every result: an answer differs from `result` only where the float64 value
    rounded the wrong way, so within its error of a midpoint, far inside `near`; and
    test_tables.py checks, for every key of every table, that the function still returns
    the stored answer."""
    key = bits & spec[3]
    index = spec[0] + 2 * K.i32((key * spec[1]) >> spec[2])
    stored_key, answer = K.gather_pair_if(tab, index, near)
    return K.where(near & (stored_key == key), answer ^ (bits & spec[4]), result)
