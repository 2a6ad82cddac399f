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


def to_f64(i):
    """An integer's value as float64 (exact below 2^53)."""
    return np.asarray(i).astype(np.float64)


def trunc_i64(x):
    """A finite float64 of magnitude below 2^63, truncated to int64."""
    return np.asarray(x).astype(np.int64)


def i64(x):
    return np.asarray(x).astype(np.int64)


def u64(x):
    return np.asarray(x).astype(np.uint64)


def u32(x):
    return np.asarray(x).astype(np.uint32)


def i32(x):
    return np.asarray(x).astype(np.int32)


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
