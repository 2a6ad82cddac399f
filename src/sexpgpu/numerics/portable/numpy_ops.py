"""The primitive operations of the portable algorithms, on numpy arrays.

Every portable algorithm calls these through the name ``K``; ``triton_ops`` provides the
same names for Triton, so one source runs on both (see ``sexpgpu.numerics.retarget``).
Arithmetic itself is written with Python operators, which are IEEE operations on float64
and wrapping operations on fixed-width integers in both worlds.
"""

import numpy as np

static_range = range


def where(cond, a, b):
    return np.where(cond, a, b)


def f64_bits(x):
    return np.asarray(x, dtype=np.float64).view(np.int64)


def f64_from_bits(i):
    return np.asarray(i, dtype=np.int64).view(np.float64)


def _cast(dtype):
    def cast(x):
        return np.asarray(x).astype(dtype)

    return cast


# to_f64: an integer's value, exact below 2^53; trunc_i64: a finite float64 of magnitude
# below 2^63, truncated
to_f64, trunc_i64, i64, u64, u32, i32 = map(_cast, (np.float64, np.int64, np.int64, np.uint64, np.uint32, np.int32))


def sqrt(x):
    return np.sqrt(x)


def umulhi(a, b):
    """High 32 bits of the 64-bit product of two uint32 values."""
    return ((np.asarray(a).astype(np.uint64) * np.uint64(b)) >> np.uint64(32)).astype(np.uint32)


def gather(table, index):
    return table[index]


def gather_pair_if(table, index, mask):
    """table[index] and table[index + 1] (index even) where mask; elsewhere any values
    (numpy reads them all)."""
    return table[index], table[index + 1]


def gather_f64(table, index):
    """The float64 whose little-endian words are table[index] and table[index + 1] (index
    even)."""
    return f64_from_bits(table[index].astype(np.int64) | (table[index + 1].astype(np.int64) << 32))


def interleave(a, b):
    """a[0], b[0], a[1], b[1], ... of two equal-length 1-D arrays."""
    return np.stack((a, b), axis=-1).reshape(-1)


def full_like(x, value):
    """The float64 constant `value` for every element of x (numpy broadcasts the scalar)."""
    return value
