"""The long accumulator's layout: which plane of an accumulator holds what.

An accumulator for an output of shape S is one int64 tensor of shape (WIDTH, *S).
Planes 0 .. DIGITS-1 are digits in radix 2**32: plane i has weight 2**(32 * (i - UNITS)),
so plane UNITS holds the units and plane 0 the lowest bits any product can reach.
The exact value of an output is sum(digits[i] * 2**(32 * (i - UNITS))).

The last three planes count the products that were NaN, +inf and -inf. They are counts,
not bits, so that adding accumulators adds them too; a normalised accumulator keeps
only whether each count is non-zero.
"""

RADIX_BITS = 32
RADIX = 1 << RADIX_BITS
LOW_MASK = RADIX - 1

# A bf16 or f32 value is an integer significand of at most 24 bits times 2**e with
# -149 <= e <= 104. A product's significand has at most 48 bits and its lowest bit
# lies at 2**-298 or above; its magnitude stays below 2**256.
LOWEST_INPUT_EXPONENT = -149

UNITS = 10
DIGITS = 18
LOWEST_DIGIT_EXPONENT = -RADIX_BITS * UNITS  # 2**-320, below 2**-298
TOP = DIGITS - 1  # the signed digit; every other digit of a normalised accumulator is in [0, 2**32)

NAN_PLANE = DIGITS
POS_INF_PLANE = DIGITS + 1
NEG_INF_PLANE = DIGITS + 2
WIDTH = DIGITS + 3

# One backend call adds at most this many products into each output. Each adds less than
# 2**32 to a digit, so a digit stays below 2**51 and is exact in int64 and in fp64.
MAX_K_PER_CALL = 1 << 19
