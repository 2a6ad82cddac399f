"""Run the portable algorithms on numpy arrays, in pieces that stay in cache."""

import numpy as np

from sexpgpu.numerics.portable import draws, philox, tables

PIECE = 1 << 14


def _pieces(n):
    return ((start, min(start + PIECE, n)) for start in range(0, n, PIECE))


def elementwise(fn, *xs):
    """fn (bits, ..., table) -> bits over float32 arrays of one shape; returns a new C-ordered array."""
    words = [np.ascontiguousarray(x).reshape(-1).view(np.uint32) for x in xs]
    out = np.empty_like(words[0])
    with np.errstate(all="ignore"):
        for a, b in _pieces(len(out)):
            out[a:b] = fn(*(w[a:b] for w in words), tables.TABLE)
    return out.view(np.float32).reshape(np.shape(xs[0]))


def philox4x32(counter, key):
    """Philox blocks of (n, 4) counters under (n, 2) keys, all uint32."""
    out = np.empty_like(counter)
    with np.errstate(all="ignore"):
        for a, b in _pieces(len(counter)):
            c, k = counter[a:b], key[a:b]
            words = philox.philox4x32(c[:, 0], c[:, 1], c[:, 2], c[:, 3], k[:, 0], k[:, 1])
            out[a:b] = np.stack(words, axis=1)
    return out


def _block_words(first, count):
    b = np.arange(first, first + count, dtype=np.uint64)
    return (b & np.uint64(0xFFFFFFFF)).astype(np.uint32), (b >> np.uint64(32)).astype(np.uint32)


def draw(blocks_fn, per_block, n, dtype, key, *params, start=0):
    """Elements start..start+n-1 of a draw whose blocks_fn(b_lo, b_hi, k0, k1, *params)
    returns the `per_block` elements of each of its blocks, in element order."""
    assert start % per_block == 0 and PIECE % per_block == 0
    out = np.empty(n, dtype=dtype)
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    with np.errstate(all="ignore"):
        for a, b in _pieces(n):
            count = -(-(b - a) // per_block)
            b_lo, b_hi = _block_words((start + a) // per_block, count)
            out[a:b] = blocks_fn(b_lo, b_hi, k0, k1, *params)[: b - a]
    return out


def _outside(z, bound):
    return (z > bound) | (z < -bound)


def truncated_normal_pairs(b_lo, b_hi, k0, k1, bound):
    """Both normals of each block's pair, each redrawn (attempt 1, 2, ...) until it lies in
    [-bound, bound]; as float64, in element order."""
    z0, z1 = draws.normal_pair(b_lo, b_hi, 0, k0, k1)
    pending0, pending1 = np.flatnonzero(_outside(z0, bound)), np.flatnonzero(_outside(z1, bound))
    attempt = 1
    while len(pending0) or len(pending1):
        pending = np.union1d(pending0, pending1)
        n0, n1 = draws.normal_pair(b_lo[pending], b_hi[pending], attempt, k0, k1)
        redo0, redo1 = np.isin(pending, pending0), np.isin(pending, pending1)
        z0[pending[redo0]] = n0[redo0]
        z1[pending[redo1]] = n1[redo1]
        pending0 = pending0[_outside(z0[pending0], bound)]
        pending1 = pending1[_outside(z1[pending1], bound)]
        attempt += 1
    return np.stack((z0, z1), axis=-1).reshape(-1)
