"""The interpreter's compiled kernels: numba, without fast-math, in the orders folds.py documents.

numba compiles these loops through LLVM with its default floating-point semantics: every
multiply and add is its own IEEE operation, rounded in the array's dtype; nothing is
reassociated or contracted into a fused multiply-add (fast-math is off, and LLVM fuses only
when told it may). LLVM vectorises the innermost loop across output elements, whose
operations are independent, so the vector width (SSE, AVX2, AVX-512) changes the speed on
a machine, never a bit. The float32 product's register tiles are written in LLVM's vector
operations directly (fold_product_tiles), with the same IEEE semantics.
tests/backends/test_cpu_fast_paths.py checks the bits against numpy's operations, one
rounded step at a time, including signed zeros, subnormals, infinities and NaN.

Compiled once per machine and cached next to this file (cache=True); each kernel has one
specialisation per float dtype (float32 for runs, float64 for the test oracle; the register
tiles are for float32 only). Every kernel
releases the GIL, so parallel.py's threads run them side by side.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic

ROW_GROUP = 4  # output rows folded together: each k reads a row of b once for all four
# every kernel: no fast-math (numba's default, said here so that no one adds it), IEEE
# results for a division by zero as numpy gives them (not Python's exception), the GIL released
OPTIONS = {"fastmath": False, "error_model": "numpy", "nogil": True}
# (helpers come first: a kernel with signatures is compiled, or loaded from the cache, at import)


@numba.njit(cache=True, inline="always", **OPTIONS)
def _fold_one_row(a_row, b, out_row, depth, width):  # pragma: no cover - compiled
    k = 2 if depth >= 2 else 1  # two k's per pass over the row (_fold_four_rows says why)
    if k == 2:
        x, z = a_row[0], a_row[1]
        b_k, b_next = b[0], b[1]
        for j in range(width):
            out_row[j] = x * b_k[j] + z * b_next[j]
    else:
        x = a_row[0]
        for j in range(width):
            out_row[j] = x * b[0, j]
    while k + 2 <= depth:
        x, z = a_row[k], a_row[k + 1]
        b_k, b_next = b[k], b[k + 1]
        for j in range(width):
            out_row[j] = (out_row[j] + x * b_k[j]) + z * b_next[j]
        k += 2
    if k < depth:
        x = a_row[k]
        for j in range(width):
            out_row[j] = out_row[j] + x * b[k, j]
    _quiet_nans(out_row, width)


@numba.njit(cache=True, inline="always", **OPTIONS)
def _quiet_nans(out_row, width):  # pragma: no cover - compiled
    for j in range(width):
        if out_row[j] != out_row[j]:
            out_row[j] = np.nan


@numba.njit(cache=True, inline="always", **OPTIONS)
def _fold_four_rows(a, b, out, i, depth, width):  # pragma: no cover - compiled
    o0, o1, o2, o3 = out[i], out[i + 1], out[i + 2], out[i + 3]
    a0, a1, a2, a3 = a[i], a[i + 1], a[i + 2], a[i + 3]
    # two k's per pass over the rows: each output is loaded and stored once for two of its
    # additions (the loads and stores of the running sums bound this loop), which stay two
    # additions in the fold's order, each rounded. The first pass stores p0 + p1, the first
    # sum of the fold (acc = p0, then acc + p1: the same rounding)
    k = 2 if depth >= 2 else 1
    if k == 2:
        x0, x1, x2, x3 = a0[0], a1[0], a2[0], a3[0]
        z0, z1, z2, z3 = a0[1], a1[1], a2[1], a3[1]
        b_k, b_next = b[0], b[1]
        for j in range(width):
            y, w = b_k[j], b_next[j]
            o0[j] = x0 * y + z0 * w
            o1[j] = x1 * y + z1 * w
            o2[j] = x2 * y + z2 * w
            o3[j] = x3 * y + z3 * w
    else:
        x0, x1, x2, x3 = a0[0], a1[0], a2[0], a3[0]
        for j in range(width):
            y = b[0, j]
            o0[j] = x0 * y
            o1[j] = x1 * y
            o2[j] = x2 * y
            o3[j] = x3 * y
    while k + 2 <= depth:
        x0, x1, x2, x3 = a0[k], a1[k], a2[k], a3[k]
        z0, z1, z2, z3 = a0[k + 1], a1[k + 1], a2[k + 1], a3[k + 1]
        b_k, b_next = b[k], b[k + 1]
        for j in range(width):
            y, w = b_k[j], b_next[j]
            o0[j] = (o0[j] + x0 * y) + z0 * w
            o1[j] = (o1[j] + x1 * y) + z1 * w
            o2[j] = (o2[j] + x2 * y) + z2 * w
            o3[j] = (o3[j] + x3 * y) + z3 * w
        k += 2
    if k < depth:
        x0, x1, x2, x3 = a0[k], a1[k], a2[k], a3[k]
        for j in range(width):
            y = b[k, j]
            o0[j] = o0[j] + x0 * y
            o1[j] = o1[j] + x1 * y
            o2[j] = o2[j] + x2 * y
            o3[j] = o3[j] + x3 * y
    for row in (o0, o1, o2, o3):
        _quiet_nans(row, width)


@numba.njit(cache=True, inline="always", **OPTIONS)
def _operands_of_row(a, b, out, row):  # pragma: no cover - compiled
    """(a's, b's and out's matrices, the row's index in them) for a flattened output row."""
    batch = row // out.shape[1]
    return a[batch if a.shape[0] > 1 else 0], b[batch if b.shape[0] > 1 else 0], out[batch], row - batch * out.shape[1]


def _product_signature(dtype):
    """a may be strided (a transposed operand is read in place), b and out are C-contiguous."""
    scalar = numba.from_dtype(np.dtype(dtype))
    array = numba.types.Array
    return numba.types.void(array(scalar, 3, "A", readonly=True), array(scalar, 3, "C", readonly=True),
                            array(scalar, 3, "C"), numba.types.intp, numba.types.intp)


@numba.njit([_product_signature(np.float32), _product_signature(np.float64)], cache=True, **OPTIONS)
def fold_products(a, b, out, first, stop):  # pragma: no cover - compiled; the tests call it through folds.matmul
    """out[p, i, :] = fold over k of a[p, i, k] * b[p, k, :] for the flattened rows
    first <= p * M + i < stop. a (Pa, M, K) may have any strides, b (Pb, K, N) and out
    (P, M, N) are C-contiguous, and Pa, Pb are P or 1 (broadcast). Each output element is acc = a0 * b0, then
    acc = acc + ak * bk for k = 1 .. K-1, vectorised across the row's N outputs. A NaN
    output is the quiet NaN of positive sign and no payload (0x7FC00000 in float32), as
    sexpgpu.numerics answers: the sign and payload the hardware gives depend on which
    operand LLVM puts first, which it may choose differently for another instruction set."""
    rows, depth, width = out.shape[1], a.shape[2], out.shape[2]
    row = first
    while row < stop:
        left, right, dest, i = _operands_of_row(a, b, out, row)
        if i + ROW_GROUP <= rows and row + ROW_GROUP <= stop:
            _fold_four_rows(left, right, dest, i, depth, width)
            row += ROW_GROUP
        else:
            _fold_one_row(left[i], right, dest[i], depth, width)
            row += 1


# --- float32 products in register tiles ---------------------------------------------------------------
# A tile of TILE_ROWS output rows by `vectors` x LANES columns stays in vector registers for the
# whole fold over k (the loops above load and store each running sum once per pass), written
# in LLVM's vector operations: fmul and fadd without fast-math flags, each lane an IEEE
# float32 operation rounded on its own, never fused (LLVM contracts only when told it may).
# On a machine with narrower vectors LLVM splits each operation into narrower ones: the same
# lanes, the same operations, other speed.

LANES = 16  # float32 lanes of one vector: an AVX-512 register
TILE_ROWS = ROW_GROUP
TILE_VECTORS = 4  # vectors across a tile: 4 x 4 running sums and 4 rows of b in registers


def _tile_codegen(rows: int, vectors: int):
    """LLVM code for one tile: out[r, c] = fold over k of a[r, k] * b[k, c], acc = p0, then acc +
    p_k for k = 1 .. depth-1, for r < rows and c < vectors * LANES; element strides; b and out
    rows contiguous."""

    def codegen(context, builder, signature, args):
        a_at, a_row, a_k, b_at, b_row, out_at, out_row, depth = args
        f32, i64 = ir.FloatType(), ir.IntType(64)
        vector = ir.VectorType(f32, LANES)
        a, b, out = (builder.inttoptr(at, f32.as_pointer()) for at in (a_at, b_at, out_at))

        def at(pointer, index):
            return builder.bitcast(builder.gep(pointer, [index]), vector.as_pointer())

        def a_broadcast(r, k):  # a[r, k] in every lane
            index = builder.add(builder.mul(ir.Constant(i64, r), a_row), builder.mul(k, a_k))
            one = builder.insert_element(ir.Constant(vector, ir.Undefined), builder.load(builder.gep(a, [index])),
                                         ir.Constant(i64, 0))
            return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined),
                                          ir.Constant(ir.VectorType(ir.IntType(32), LANES), None))

        def b_rows(k):
            return [builder.load(at(b, builder.add(builder.mul(k, b_row), ir.Constant(i64, c * LANES))), align=4)
                    for c in range(vectors)]

        # running sums in stack slots, which LLVM promotes to registers
        sums = [[cgutils.alloca_once(builder, vector) for _ in range(vectors)] for _ in range(rows)]
        first = b_rows(ir.Constant(i64, 0))
        for r in range(rows):
            x = a_broadcast(r, ir.Constant(i64, 0))
            for c in range(vectors):
                builder.store(builder.fmul(x, first[c]), sums[r][c])
        with cgutils.for_range_slice(builder, ir.Constant(i64, 1), depth, ir.Constant(i64, 1)) as (k, _):
            row_k = b_rows(k)
            for r in range(rows):
                x = a_broadcast(r, k)
                for c in range(vectors):
                    builder.store(builder.fadd(builder.load(sums[r][c]), builder.fmul(x, row_k[c])), sums[r][c])
        for r in range(rows):
            for c in range(vectors):
                index = builder.add(builder.mul(ir.Constant(i64, r), out_row), ir.Constant(i64, c * LANES))
                builder.store(builder.load(sums[r][c]), at(out, index), align=4)
        return context.get_dummy_value()

    return codegen


def _tile(rows: int, vectors: int):
    """The tile as a function of (a, a's row and k strides, b, b's row stride, out, out's row
    stride, depth): addresses of float32 elements and strides in elements."""

    @intrinsic
    def tile(typingctx, a_at, a_row, a_k, b_at, b_row, out_at, out_row, depth):
        intp = numba.types.intp
        return numba.types.void(*([intp] * 8)), _tile_codegen(rows, vectors)

    return tile


_tile_wide = _tile(TILE_ROWS, TILE_VECTORS)
_tile_narrow = _tile(TILE_ROWS, 1)
_tile_one_row = _tile(1, 1)


@numba.njit(cache=True, inline="always", **OPTIONS)
def _fold_columns(a, b, out, i, rows, first_column, depth, width):  # pragma: no cover - compiled
    """The fold of _tile_codegen for out[i:i + rows, first_column:width], one element at a time."""
    for r in range(i, i + rows):
        for j in range(first_column, width):
            acc = a[r, 0] * b[0, j]
            for k in range(1, depth):
                acc = acc + a[r, k] * b[k, j]
            out[r, j] = acc


@numba.njit([_product_signature(np.float32)], cache=True, **OPTIONS)
def fold_product_tiles(a, b, out, first, stop):  # pragma: no cover - compiled; the tests call it through folds.matmul
    """fold_products for float32, in register tiles: the same operations in the same order
    (each output acc = a0 * b0, then acc + ak * bk; a NaN output the quiet NaN), other loops.
    b's and out's rows are contiguous, a has any strides (element strides: each a multiple of 4 bytes)."""
    rows, depth, width = out.shape[1], a.shape[2], out.shape[2]
    item = out.itemsize
    row = first
    while row < stop:
        left, right, dest, i = _operands_of_row(a, b, out, row)
        group = TILE_ROWS if i + TILE_ROWS <= rows and row + TILE_ROWS <= stop else 1
        strides = (left.strides[0] // item, left.strides[1] // item, right.strides[0] // item, dest.strides[0] // item)
        a_at = left.ctypes.data + i * left.strides[0]
        out_at = dest.ctypes.data + i * dest.strides[0]
        j = 0
        if group == TILE_ROWS:
            while j + TILE_VECTORS * LANES <= width:
                _tile_wide(a_at, strides[0], strides[1], right.ctypes.data + j * item, strides[2], out_at + j * item,
                           strides[3], depth)
                j += TILE_VECTORS * LANES
            while j + LANES <= width:
                _tile_narrow(a_at, strides[0], strides[1], right.ctypes.data + j * item, strides[2], out_at + j * item,
                             strides[3], depth)
                j += LANES
        else:
            while j + LANES <= width:
                _tile_one_row(a_at, strides[0], strides[1], right.ctypes.data + j * item, strides[2],
                              out_at + j * item, strides[3], depth)
                j += LANES
        _fold_columns(left, right, dest, i, group, j, depth, width)
        for r in range(i, i + group):
            _quiet_nans(dest[r], width)
        row += group


@numba.njit(cache=True, **OPTIONS)
def fold_last_axis(x, out, first, stop):  # pragma: no cover - compiled; the tests call it through folds.reduce_sum
    """out[r] = x[r, 0] + x[r, 1] + ... + x[r, W-1], folded left to right, for rows first <= r
    < stop of a C-contiguous (R, W) x, W >= 1. Four rows' folds run side by side (independent
    chains of additions, which the processor overlaps); a NaN sum is the quiet NaN, as above."""
    width = x.shape[1]
    row = first
    while row + ROW_GROUP <= stop:
        acc0, acc1, acc2, acc3 = x[row, 0], x[row + 1, 0], x[row + 2, 0], x[row + 3, 0]
        for j in range(1, width):
            acc0 = acc0 + x[row, j]
            acc1 = acc1 + x[row + 1, j]
            acc2 = acc2 + x[row + 2, j]
            acc3 = acc3 + x[row + 3, j]
        out[row], out[row + 1], out[row + 2], out[row + 3] = acc0, acc1, acc2, acc3
        row += ROW_GROUP
    for rest in range(row, stop):
        acc = x[rest, 0]
        for j in range(1, width):
            acc = acc + x[rest, j]
        out[rest] = acc
    _quiet_nans(out[first:stop], stop - first)


@numba.njit(cache=True, **OPTIONS)
def add_rows_at(ids, values, out):  # pragma: no cover - compiled; the tests call it through the scatter_add kernel
    """out[ids[i]] += values[i] for i = 0, 1, ... in order, each addition rounded on its own (as
    np.add.at adds, one row at a time); values (N, W) and out (R, W) are C-contiguous."""
    for i in range(ids.size):
        row = out[ids[i]]
        value = values[i]
        for j in range(row.size):
            row[j] = row[j] + value[j]


@numba.njit(cache=True, **OPTIONS)
def mixed_sum(words, mix_1, mix_2):  # pragma: no cover - compiled; test_fingerprint.py checks it against the formula
    """fingerprint.py's sum modulo 2^64 of mix((i << 32) | w_i) over uint32 words; unsigned
    64-bit arithmetic wraps."""
    total = np.uint64(0)
    for index in range(words.size):
        z = (np.uint64(index) << np.uint64(32)) | np.uint64(words[index])
        z ^= z >> np.uint64(30)
        z *= mix_1
        z ^= z >> np.uint64(27)
        z *= mix_2
        z ^= z >> np.uint64(31)
        total += z
    return total
