"""The Triton kernels' wrappers: load, call a portable function, store.

Plain functions that retarget.py compiles in the namespace of the portable algorithms.
Float32 data is loaded and stored as bits; every computation happens in the portable code.
Scalar parameters arrive in a small int64 tensor `args`, so that no launch argument is
specialised or converted by Triton (a Python float argument would become float32).
"""

import triton.language as tl

WORD = 0xFFFFFFFF


def block_offsets(BLOCK: tl.constexpr):
    return tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)


def unary_kernel(x_ptr, out_ptr, n, tab, FN: tl.constexpr, BLOCK: tl.constexpr):
    offsets = block_offsets(BLOCK)
    mask = offsets < n
    bits = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.uint32, bitcast=True)
    tl.store(out_ptr + offsets, FN(bits, tab).to(tl.float32, bitcast=True), mask=mask)


def binary_kernel(x_ptr, y_ptr, out_ptr, n, tab, FN: tl.constexpr, BLOCK: tl.constexpr):
    offsets = block_offsets(BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.uint32, bitcast=True)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.uint32, bitcast=True)
    tl.store(out_ptr + offsets, FN(x, y, tab).to(tl.float32, bitcast=True), mask=mask)


def word(ptr, offsets, mask):
    return tl.load(ptr + offsets, mask=mask, other=0).to(tl.uint32, bitcast=True)


def philox_kernel(counter_ptr, key_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = block_offsets(BLOCK)
    mask = offsets < n
    c = counter_ptr + 4 * offsets
    k = key_ptr + 2 * offsets
    o = out_ptr + 4 * offsets
    w0, w1, w2, w3 = philox4x32(word(c, 0, mask), word(c, 1, mask), word(c, 2, mask),
                                word(c, 3, mask), word(k, 0, mask), word(k, 1, mask))
    tl.store(o, w0.to(tl.int32, bitcast=True), mask=mask)
    tl.store(o + 1, w1.to(tl.int32, bitcast=True), mask=mask)
    tl.store(o + 2, w2.to(tl.int32, bitcast=True), mask=mask)
    tl.store(o + 3, w3.to(tl.int32, bitcast=True), mask=mask)


def draw_setup(args, BLOCK: tl.constexpr, PER_BLOCK: tl.constexpr):
    """This program's element offsets, its Philox blocks' number words, and the key words."""
    offsets = block_offsets(BLOCK)
    blocks = tl.program_id(0).to(tl.int64) * (BLOCK // PER_BLOCK) + tl.arange(0, BLOCK // PER_BLOCK)
    b_lo = (blocks & WORD).to(tl.uint32)
    b_hi = (blocks >> 32).to(tl.uint32)
    return offsets, b_lo, b_hi, tl.load(args).to(tl.uint32), tl.load(args + 1).to(tl.uint32)


def f64_arg(args, i):
    return tl.load(args + i).to(tl.float64, bitcast=True)


def store_f32(out_ptr, offsets, n, bits):
    tl.store(out_ptr + offsets, bits.to(tl.float32, bitcast=True), mask=offsets < n)


def uniform_kernel(out_ptr, n, args, BLOCK: tl.constexpr):
    offsets, b_lo, b_hi, k0, k1 = draw_setup(args, BLOCK, 4)
    out = uniform_f32(b_lo, b_hi, k0, k1, f64_arg(args, 2), f64_arg(args, 3),
                      tl.load(args + 4).to(tl.uint32), tl.load(args + 5).to(tl.uint32))
    store_f32(out_ptr, offsets, n, out)


def bernoulli_kernel(out_ptr, n, args, BLOCK: tl.constexpr):
    offsets, b_lo, b_hi, k0, k1 = draw_setup(args, BLOCK, 4)
    hit = bernoulli(b_lo, b_hi, k0, k1, tl.load(args + 2).to(tl.uint64))
    tl.store(out_ptr + offsets, hit.to(tl.uint8), mask=offsets < n)


def randint_kernel(out_ptr, n, args, BLOCK: tl.constexpr):
    offsets, b_lo, b_hi, k0, k1 = draw_setup(args, BLOCK, 2)
    out = randint_i32(b_lo, b_hi, k0, k1, tl.load(args + 2), tl.load(args + 3).to(tl.uint64))
    tl.store(out_ptr + offsets, out, mask=offsets < n)


def normal_kernel(out_ptr, n, args, BLOCK: tl.constexpr):
    offsets, b_lo, b_hi, k0, k1 = draw_setup(args, BLOCK, 2)
    store_f32(out_ptr, offsets, n, normal_f32(b_lo, b_hi, k0, k1, f64_arg(args, 2), f64_arg(args, 3)))


def larger(a, b):
    return tl.maximum(a, b)


def any_set(flags):
    # tl.reduce with our own combine function rather than tl.max, which Triton defines as a
    # jitted library function and so would not follow a switch to the interpreter
    return tl.reduce(flags.to(tl.int32), 0, larger) > 0


def outside(z, bound, valid):
    return ((z > bound) | (z < -bound)) & valid


def truncated_normal_kernel(out_ptr, n, args, BLOCK: tl.constexpr):
    """Each element redraws (attempt 1, 2, ...) until |z| <= bound; the program loops until
    all of its elements are done."""
    offsets, b_lo, b_hi, k0, k1 = draw_setup(args, BLOCK, 2)
    bound = f64_arg(args, 4)
    first = 2 * (tl.program_id(0).to(tl.int64) * (BLOCK // 2) + tl.arange(0, BLOCK // 2))
    valid0 = first < n
    valid1 = first + 1 < n
    z0, z1 = normal_pair(b_lo, b_hi, 0, k0, k1)
    redo0 = outside(z0, bound, valid0)
    redo1 = outside(z1, bound, valid1)
    attempt = tl.full([], 1, tl.uint32)
    while any_set(redo0 | redo1):
        n0, n1 = normal_pair(b_lo, b_hi, attempt, k0, k1)
        z0 = tl.where(redo0, n0, z0)
        z1 = tl.where(redo1, n1, z1)
        redo0 = outside(z0, bound, valid0)
        redo1 = outside(z1, bound, valid1)
        attempt += 1
    z = K.interleave(z0, z1)
    store_f32(out_ptr, offsets, n, scaled_f32(z, f64_arg(args, 2), f64_arg(args, 3)))
