"""A parameter's fingerprint: 64 bits that change when any of its bits change, computed
where the parameter lives.

The run loop logs a digest of every parameter at every step (run/digest.py). Hashing the
bytes themselves would bring every parameter to the host each step (for a 50M-parameter
model, 200 MB copied and hashed, several times the step). Instead each backend reduces a
parameter to this fingerprint on its own device, and only the fingerprints are hashed.

The parameter is read as float32 values (a bf16 parameter widened exactly, as the CPU
interpreter stores it) and those as 32-bit words w_0 .. w_{n-1} in C order. Each word is
tagged with its position and mixed by the splitmix64 finalizer, and the results are added
modulo 2^64:

    fingerprint = sum over i of mix((i << 32) | w_i)  mod 2^64
    mix(z): z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31

Integer addition modulo 2^64 is associative and commutative, so any reduction order, on
any device, gives the same fingerprint. A changed word changes its term to an unrelated
64-bit value and the sum with it; a moved word changes its position tag.
"""

from __future__ import annotations

import numpy as np

MIX_1 = 0xBF58476D1CE4E5B9
MIX_2 = 0x94D049BB133111EB


def fingerprint(value) -> int:
    """The fingerprint of a parameter held as a numpy array of float32 values."""
    from sexpgpu.backends.cpu import native  # numba: imported at the first fingerprint (folds._native says why)

    words = np.ascontiguousarray(value, dtype=np.float32).reshape(-1).view(np.uint32)
    return int(native.mixed_sum(words, np.uint64(MIX_1), np.uint64(MIX_2)))
