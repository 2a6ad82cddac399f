"""Oracles independent of the implementation, for the numerics tests.

mpmath values at 200 bits of the float32 functions, rounded to float32 (nearest, ties to
even, with subnormals and overflow) in exact steps; and Philox4x32-10 on Python ints.
"""

import mpmath as mp
import numpy as np

PRECISION = 200
FUNCTIONS = {
    "exp": mp.exp,
    "expm1": mp.expm1,
    "log": mp.log,
    "log1p": mp.log1p,
    "tanh": mp.tanh,
    "sigmoid": lambda x: 1 / (1 + mp.exp(-x)),
    "erf": mp.erf,
    "cos": mp.cos,
    "sin": mp.sin,
    "rsqrt": lambda x: 1 / mp.sqrt(x),
}
QUIET_NAN = 0x7FC00000


def f32_value(bits):
    return mp.mpf(float(np.uint32(bits).view(np.float32)))


def exact(name, bits):
    """The exact value of a function at a finite float32 input, to 200 bits (None: NaN)."""
    with mp.workprec(PRECISION):
        x = f32_value(bits)
        if name == "log" and x < 0 or name == "log1p" and x < -1 or name == "rsqrt" and x < 0:
            return None
        if name == "log" and x == 0 or name == "log1p" and x == -1:
            return -mp.inf
        if name == "rsqrt" and x == 0:
            return mp.inf if not (int(bits) >> 31) else -mp.inf
        return FUNCTIONS[name](x)


def quantum(v):
    """The float32 spacing at the magnitude of v (2^-149 in the subnormal range)."""
    _, e = mp.frexp(v)  # |v| in [2^(e-1), 2^e)
    return mp.mpf(2) ** max(e - 24, -149)


def round_bits(v):
    """float32 bits of v rounded to nearest, ties to even (v an mpf, +-inf or None = NaN).

    All arithmetic, abs() included, runs at the working precision set here: mpmath rounds
    every result to the context's precision, and at the default 53 bits a value within
    2^-54 of a midpoint would land on it."""
    if v is None:
        return QUIET_NAN
    with mp.workprec(PRECISION + 50):
        sign = 0x80000000 if v < 0 else 0
        a = abs(v)
        if a == mp.inf:
            return sign | 0x7F800000
        if a == 0:
            return sign
        q = quantum(a)
        units = a / q
        n = int(mp.floor(units))
        rest = units - n
        if rest > 0.5 or rest == 0.5 and n % 2 == 1:
            n += 1
        value = n * q
        if value >= mp.mpf(2) ** 128:
            return sign | 0x7F800000
    return sign | int(np.float32(float(value)).view(np.uint32))


def midpoint_distance(v):
    """Distance from v to the nearest float32 rounding midpoint, in float32 ulps."""
    with mp.workprec(PRECISION + 50):
        units = abs(v) / quantum(v)
        return abs(units - mp.floor(units) - mp.mpf(1) / 2)


ODD_AT_ZERO = ("expm1", "log1p", "tanh", "erf", "sin")


def correct(name, bits):
    """The correctly rounded float32 bits of a function at the float32 with these bits
    (IEEE 754 conventions at signed zeros: odd functions keep the sign)."""
    bits = int(bits)
    x = float(np.uint32(bits).view(np.float32))
    if x != x:
        return QUIET_NAN
    if x in (float("inf"), float("-inf")):
        return round_bits(_limit(name, x))
    if x == 0 and name in ODD_AT_ZERO:
        return bits
    return round_bits(exact(name, bits))


def pow_exact(x_bits, y_bits, negative=False):
    """x^y to 200 bits for finite x > 0 and finite y (float32 bit patterns), negated if
    `negative` (at 200 bits too: negation rounds to the context's precision)."""
    with mp.workprec(PRECISION):
        v = mp.power(f32_value(x_bits), f32_value(y_bits))
        return -v if negative else v


def _limit(name, x):
    positive = x > 0
    limits = {
        "exp": (mp.inf, mp.mpf(0)), "expm1": (mp.inf, mp.mpf(-1)), "log": (mp.inf, None),
        "log1p": (mp.inf, None), "tanh": (mp.mpf(1), mp.mpf(-1)), "sigmoid": (mp.mpf(1), mp.mpf(0)),
        "erf": (mp.mpf(1), mp.mpf(-1)), "cos": (None, None), "sin": (None, None),
        "rsqrt": (mp.mpf(0), None),
    }
    return limits[name][0 if positive else 1]


def philox_reference(counter, key):
    """Philox4x32-10 (Salmon et al. 2011) on Python ints: 10 rounds, key bumped between."""
    c, (k0, k1) = list(counter), key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return tuple(c)
