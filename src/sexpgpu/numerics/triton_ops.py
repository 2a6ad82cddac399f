"""The primitive operations of the portable algorithms, in Triton (see portable/numpy_ops.py).

Plain functions: retarget.py jit-compiles them (or hands them to Triton's interpreter).
Imported only when a CUDA tensor or the Triton interpreter is used.
"""

import triton.language as tl


def where(cond, a, b):
    return tl.where(cond, a, b)


def f64_bits(x):
    return x.to(tl.int64, bitcast=True)


def f64_from_bits(i):
    return i.to(tl.float64, bitcast=True)


def to_f64(i):
    return i.to(tl.float64)


def trunc_i64(x):
    return x.to(tl.int64)


def i64(x):
    return x.to(tl.int64)


def u64(x):
    return x.to(tl.uint64)


def u32(x):
    return x.to(tl.uint32)


def i32(x):
    return x.to(tl.int32)


def sqrt(x):
    # float64 square root lowers to sqrt.rn.f64: IEEE, correctly rounded
    return tl.sqrt(x)


def umulhi(a, b):
    return tl.umulhi(a, b)


def gather(table, index):
    # the table is stored as int32 on the device; its words are uint32
    return tl.load(table + index).to(tl.uint32, bitcast=True)


def gather_pair_if(table, index, mask):
    # one 8-byte load (the words are little-endian halves): index is even and the table's
    # pairs 8-byte aligned (tables.py, and CUDA allocations are); lanes outside the mask
    # issue no memory access and callers ignore their values
    pair = tl.load((table + index).to(tl.pointer_type(tl.int64)), mask=mask, other=0)
    return (pair & 0xFFFFFFFF).to(tl.uint32), (pair >> 32).to(tl.uint32)


def gather_pair_every(table, index, mask):
    # gather_pair_if as the numpy path does it, every lane reading two words (retarget's
    # portable build, as before the pair load)
    return (tl.load(table + index).to(tl.uint32, bitcast=True),
            tl.load(table + index + 1).to(tl.uint32, bitcast=True))


def gather_f64(table, index):
    # one 8-byte load of the word pair, as gather_pair_if's (index even, pairs aligned)
    return tl.load((table + index).to(tl.pointer_type(tl.float64)))


def interleave(a, b):
    return tl.reshape(tl.join(a, b), [2 * a.shape[0]])


def full_like(x, value):
    # a float64 splat: a Python float passed to tl.where beside another scalar would be
    # made float32 first
    return tl.full(x.shape, value, tl.float64)
