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


def draw_setup(out_ptr, n, args, args_stride, BLOCK: tl.constexpr, PER_BLOCK: tl.constexpr,
               COPIES: tl.constexpr):
    """This program's part of a draw of rows of n elements (cuda.draw_into): BLOCK elements
    of one row, which reads its own row of `args`. Returns the part's element offsets in its
    row, where the row's first copy starts, the part's Philox block numbers as two words,
    the row's args and its key words."""
    pid = tl.program_id(0).to(tl.int64)
    parts = (n + BLOCK - 1) // BLOCK
    row = pid // parts
    part = pid - row * parts
    offsets = part * BLOCK + tl.arange(0, BLOCK)
    blocks = part * (BLOCK // PER_BLOCK) + tl.arange(0, BLOCK // PER_BLOCK)
    b_lo = (blocks & WORD).to(tl.uint32)
    b_hi = (blocks >> 32).to(tl.uint32)
    args = args + row * args_stride
    target = out_ptr + row * COPIES * n
    return offsets, target, b_lo, b_hi, args, tl.load(args).to(tl.uint32), tl.load(args + 1).to(tl.uint32)


def store_copies(target, offsets, n, values, COPIES: tl.constexpr):
    """The row's values, COPIES times one after another (a stacked draw repeats its block)."""
    for _ in K.static_range(COPIES):
        tl.store(target + offsets, values, mask=offsets < n)
        target += n


def f64_arg(args, i):
    return tl.load(args + i).to(tl.float64, bitcast=True)


def as_f32(bits):
    return bits.to(tl.float32, bitcast=True)


def uniform_kernel(out_ptr, n, args, args_stride, BLOCK: tl.constexpr, COPIES: tl.constexpr):
    offsets, target, b_lo, b_hi, args, k0, k1 = draw_setup(out_ptr, n, args, args_stride, BLOCK, 4, COPIES)
    out = uniform_f32(b_lo, b_hi, k0, k1, f64_arg(args, 2), f64_arg(args, 3),
                      tl.load(args + 4).to(tl.uint32), tl.load(args + 5).to(tl.uint32))
    store_copies(target, offsets, n, as_f32(out), COPIES)


def bernoulli_kernel(out_ptr, n, args, args_stride, BLOCK: tl.constexpr, COPIES: tl.constexpr):
    offsets, target, b_lo, b_hi, args, k0, k1 = draw_setup(out_ptr, n, args, args_stride, BLOCK, 4, COPIES)
    hit = bernoulli(b_lo, b_hi, k0, k1, tl.load(args + 2).to(tl.uint64))
    store_copies(target, offsets, n, hit.to(tl.uint8), COPIES)


def randint_kernel(out_ptr, n, args, args_stride, BLOCK: tl.constexpr, COPIES: tl.constexpr):
    offsets, target, b_lo, b_hi, args, k0, k1 = draw_setup(out_ptr, n, args, args_stride, BLOCK, 2, COPIES)
    out = randint_i32(b_lo, b_hi, k0, k1, tl.load(args + 2), tl.load(args + 3).to(tl.uint64))
    store_copies(target, offsets, n, out, COPIES)


def normal_kernel(out_ptr, n, args, args_stride, BLOCK: tl.constexpr, COPIES: tl.constexpr):
    offsets, target, b_lo, b_hi, args, k0, k1 = draw_setup(out_ptr, n, args, args_stride, BLOCK, 2, COPIES)
    out = normal_f32(b_lo, b_hi, k0, k1, f64_arg(args, 2), f64_arg(args, 3))
    store_copies(target, offsets, n, as_f32(out), COPIES)


def larger(a, b):
    return tl.maximum(a, b)


def any_set(flags):
    # tl.reduce with our own combine function rather than tl.max, which Triton defines as a
    # jitted library function and so would not follow a switch to the interpreter
    return tl.reduce(flags.to(tl.int32), 0, larger) > 0


def outside(z, bound, valid):
    return ((z > bound) | (z < -bound)) & valid


def truncated_normal_kernel(out_ptr, n, args, args_stride, BLOCK: tl.constexpr, COPIES: tl.constexpr):
    """Each element redraws (attempt 1, 2, ...) until |z| <= bound; the program loops until
    all of its elements are done."""
    offsets, target, b_lo, b_hi, args, k0, k1 = draw_setup(out_ptr, n, args, args_stride, BLOCK, 2, COPIES)
    bound = f64_arg(args, 4)
    first = 2 * ((b_hi.to(tl.int64) << 32) | b_lo.to(tl.int64))  # each pair's first element
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
    store_copies(target, offsets, n, as_f32(scaled_f32(z, f64_arg(args, 2), f64_arg(args, 3))), COPIES)


def fold_salt(k0, k1, salt_ptr, salt_stride, rows, mask):
    """fold_in of each row's salt (signed, taken modulo 2^64 as fold_in takes it) into its key."""
    v = tl.load(salt_ptr + rows * salt_stride, mask=mask, other=0).to(tl.int64)
    return fold_in_words((v & WORD).to(tl.uint32), (v >> 32).to(tl.uint32), k0, k1)


def fold_keys_kernel(source, source_stride, out, rows, s0, t0, s1, t1, s2, t2, s3, t3,
                     SALTS: tl.constexpr, WORDS: tl.constexpr, BLOCK: tl.constexpr):
    """Row r of `out` (rows of WORDS int64 args words): row r of `source` (source_stride 0:
    its one row) with up to four salts folded into its key words in order, salt j read at
    s_j + r t_j (t_j 0 for one salt for every row); the parameter words copied."""
    r = block_offsets(BLOCK)
    mask = r < rows
    row = source + r * source_stride
    k0 = tl.load(row, mask=mask, other=0).to(tl.uint32)
    k1 = tl.load(row + 1, mask=mask, other=0).to(tl.uint32)
    k0, k1 = fold_salt(k0, k1, s0, t0, r, mask)
    if SALTS > 1:
        k0, k1 = fold_salt(k0, k1, s1, t1, r, mask)
    if SALTS > 2:
        k0, k1 = fold_salt(k0, k1, s2, t2, r, mask)
    if SALTS > 3:
        k0, k1 = fold_salt(k0, k1, s3, t3, r, mask)
    target = out + r * WORDS
    for j in K.static_range(2, WORDS):  # a row reads only its own words, so out may be source
        tl.store(target + j, tl.load(row + j, mask=mask), mask=mask)
    tl.store(target, k0.to(tl.int64), mask=mask)
    tl.store(target + 1, k1.to(tl.int64), mask=mask)
