"""Run the portable algorithms on numpy arrays, in pieces that stay in cache."""

import numpy as np

from .portable import draws, philox, tables

PIECE = 1 << 14


def _pieces(n):
    return ((start, min(start + PIECE, n)) for start in range(0, n, PIECE))


def unary(fn, x):
    """fn (bits, table) -> bits over a float32 array; returns a new C-ordered array."""
    bits = np.ascontiguousarray(x).reshape(-1).view(np.uint32)
    out = np.empty_like(bits)
    with np.errstate(all="ignore"):
        for a, b in _pieces(len(bits)):
            out[a:b] = fn(bits[a:b], tables.TABLE)
    return out.view(np.float32).reshape(np.shape(x))


def binary(fn, x, y):
    """fn (x bits, y bits, table) -> bits over two float32 arrays of one shape."""
    xb = np.ascontiguousarray(x).reshape(-1).view(np.uint32)
    yb = np.ascontiguousarray(y).reshape(-1).view(np.uint32)
    out = np.empty_like(xb)
    with np.errstate(all="ignore"):
        for a, b in _pieces(len(xb)):
            out[a:b] = fn(xb[a:b], yb[a:b], tables.TABLE)
    return out.view(np.float32).reshape(np.shape(x))


def philox4x32(counter, key):
    """Philox blocks of (n, 4) counters under (n, 2) keys, all uint32."""
    out = np.empty_like(counter)
    with np.errstate(all="ignore"):
        for a, b in _pieces(len(counter)):
            c, k = counter[a:b], key[a:b]
            words = philox.philox4x32(c[:, 0], c[:, 1], c[:, 2], c[:, 3], k[:, 0], k[:, 1])
            out[a:b] = np.stack(words, axis=1)
    return out


def _index_words(a, b):
    i = np.arange(a, b, dtype=np.uint64)
    return (i & np.uint64(0xFFFFFFFF)).astype(np.uint32), (i >> np.uint64(32)).astype(np.uint32)


def draw(element, n, dtype, key, *params, start=0):
    """element(i_lo, i_hi, k0, k1, *params) for the flat indices start..start+n-1."""
    out = np.empty(n, dtype=dtype)
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    with np.errstate(all="ignore"):
        for a, b in _pieces(n):
            i_lo, i_hi = _index_words(start + a, start + b)
            out[a:b] = element(i_lo, i_hi, k0, k1, *params)
    return out


def truncated_normal(n, key, mean, std, bound, start=0):
    """Each element redraws (attempt 1, 2, ...) until its z lies in [-bound, bound]."""
    out = np.empty(n, dtype=np.uint32)
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    with np.errstate(all="ignore"):
        for a, b in _pieces(n):
            i_lo, i_hi = _index_words(start + a, start + b)
            z = draws.normal_attempt(i_lo, i_hi, 0, k0, k1)
            pending = np.flatnonzero((z > bound) | (z < -bound))
            attempt = 1
            while len(pending):
                z[pending] = draws.normal_attempt(i_lo[pending], i_hi[pending], attempt, k0, k1)
                pending = pending[(z[pending] > bound) | (z[pending] < -bound)]
                attempt += 1
            out[a:b] = draws.scaled_f32(z, mean, std)
    return out.view(np.float32)
