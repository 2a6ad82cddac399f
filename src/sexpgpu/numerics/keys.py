"""Stream keys: where a draw's bits come from.

A key is two uint32 words. stream_key hashes a run's seed and a draw's path with SHA-256,
so it is the same on every platform and Python version (Python's hash() is salted per
process and is never used). fold_in derives the key of a salted stream from a key and a
64-bit value with one Philox block whose counter no draw uses, so a salt selects another
stream and changes nothing else.
"""

import dataclasses
import hashlib

import numpy as np

from sexpgpu.numerics.portable import philox

DOMAIN = b"sexpgpu.numerics.stream_key.v1\x00"
WORD = 0xFFFFFFFF


def _check_word(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"Key word {name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= WORD:
        raise ValueError(f"Key word {name} must lie in [0, 2^32), got {value}")


@dataclasses.dataclass(frozen=True)
class Key:
    """A stream key: the Philox key words (k0, k1)."""

    k0: int
    k1: int

    def __post_init__(self):
        _check_word("k0", self.k0)
        _check_word("k1", self.k1)
        object.__setattr__(self, "k0", int(self.k0))
        object.__setattr__(self, "k1", int(self.k1))

    @property
    def words(self):
        return (self.k0, self.k1)

    def __repr__(self):
        return f"Key(0x{self.k0:08x}, 0x{self.k1:08x})"


def stream_key(seed, path):
    """The key of the draw at `path` in a run with `seed` (an int in [0, 2^64)).

    SHA-256 of DOMAIN + seed as 8 little-endian bytes + path in UTF-8; k0 and k1 are the
    digest's first two 4-byte words, little-endian.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"stream_key: seed must be an int, got {type(seed).__name__}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"stream_key: seed must lie in [0, 2^64), got {seed}")
    if not isinstance(path, str):
        raise TypeError(f"stream_key: path must be a str, got {type(path).__name__}")
    digest = hashlib.sha256(DOMAIN + int(seed).to_bytes(8, "little") + path.encode()).digest()
    return Key(int.from_bytes(digest[0:4], "little"), int.from_bytes(digest[4:8], "little"))


def fold_in(key, value):
    """The key of the stream that `value` (a salt, any int in [-2^63, 2^64)) selects.

    value is taken modulo 2^64; the new key is words 0 and 1 of the Philox block with
    counter (value mod 2^32, value >> 32, 0, 1) under `key`.
    """
    if not isinstance(key, Key):
        raise TypeError(f"fold_in: key must be a Key, got {type(key).__name__}")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"fold_in: value must be an int, got {type(value).__name__}")
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"fold_in: value must lie in [-2^63, 2^64), got {value}")
    v = int(value) % 2**64
    words = [np.array([w], dtype=np.uint32) for w in (v & WORD, v >> 32, key.k0, key.k1)]
    with np.errstate(over="ignore"):
        k0, k1 = philox.fold_in_words(*words)
    return Key(int(k0[0]), int(k1[0]))
