"""erf: a polynomial of degree 7 on each of 26 pieces of |x|, its coefficients read from the
table per element (Triton has no per-lane branch; one Horner evaluation serves every piece).

A piece is the top 12 bits of |x|'s float32 bits, clamped to [0x3EF, 0x408]. Piece 0 is
|x| < 1/2, where erf(x) = x P(x^2); P(0) is the float64 nearest 2/sqrt(pi), so that for tiny
x the value is x P(0), rounded once. Pieces 1 to 24 split [1/2, 4) eight to a binade, each a
polynomial in s = |x| - c, c its midpoint. Piece 25, from 4 on, is the constant 1 (erf
rounds to 1 from 3.919206). The polynomials (polynomials.py, tools/fit_polynomials.py) err by
up to 2^-40.5 absolute, and the few inputs that this error rounds the wrong way are in the
hard-case table (docs/numerics.md).
"""

from sexpgpu.numerics.portable import numpy_ops as K
from sexpgpu.numerics.portable.exp import clamp_f32, finish
from sexpgpu.numerics.portable.ieee import absolute, f32_to_f64, horner_table, with_sign
from sexpgpu.numerics.portable.tables import ERF_CASES, ERF_COEFFICIENT_COUNT, ERF_COEFFICIENTS_AT, ERF_PIECES

ERF_TOP_SMALL = 0x3EF  # the top 12 bits of |x| below 1/2, clamped: piece 0
ERF_BITS_LOW = 0x3EF00000
ERF_BITS_HIGH = 0x40800000  # 4.0: piece 25
ERF_MIDDLE = 0x80000  # the bit below a piece's 12 bits: its midpoint


def erf_f32(bits, tab):
    magnitude = bits & 0x7FFFFFFF
    a = clamp_f32(absolute(f32_to_f64(bits)), magnitude, 0.0, 4.0)
    top = K.where(magnitude < ERF_BITS_LOW, ERF_BITS_LOW,
                  K.where(magnitude > ERF_BITS_HIGH, ERF_BITS_HIGH, magnitude)) >> 20
    piece = K.i32(top) - ERF_TOP_SMALL
    small = piece == 0
    # both variables are exact: x^2 of a float32, and s by Sterbenz (c in |x|'s binade)
    v = K.where(small, a * a, a - f32_to_f64((top << 20) | ERF_MIDDLE))
    p = horner_table(v, tab, ERF_COEFFICIENTS_AT + 2 * piece, 2 * ERF_PIECES, ERF_COEFFICIENT_COUNT)
    y = with_sign(K.where(small, a * p, p), bits)
    return finish(bits, magnitude > 0x7F800000, y, 0.0, tab, ERF_CASES)
