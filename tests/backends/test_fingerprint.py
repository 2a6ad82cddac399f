"""Parameter fingerprints (backends/cpu/fingerprint.py) against a plain-Python reading of
their definition, and what they notice."""

from __future__ import annotations

import numpy as np
import pytest

from sexpgpu.backends.cpu.fingerprint import MIX_1, MIX_2, fingerprint

MOD = 2**64


def reference(values) -> int:
    """The definition, one word at a time in Python integers."""
    total = 0
    words = np.asarray(values, dtype=np.float32).reshape(-1).view(np.uint32).tolist()
    for position, word in enumerate(words):
        z = (position << 32) | word
        z ^= z >> 30
        z = z * MIX_1 % MOD
        z ^= z >> 27
        z = z * MIX_2 % MOD
        z ^= z >> 31
        total += z
    return total % MOD


@pytest.mark.parametrize("shape", [(), (1,), (7, 13), (20005,)])
def test_the_fingerprint_is_its_definition(shape):
    values = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    assert fingerprint(values) == reference(values)


def test_specials_and_signed_zeros_are_words_like_any_other():
    values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45], dtype=np.float32)
    assert fingerprint(values) == reference(values)
    assert fingerprint(values[:1]) != fingerprint(values[1:2])


def test_any_flipped_bit_or_swap_changes_it():
    values = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    base = fingerprint(values)
    for position in (0, 17, 999):
        for bit in (0, 22, 31):
            changed = values.copy()
            changed.view(np.uint32)[position] ^= np.uint32(1 << bit)
            assert fingerprint(changed) != base
    swapped = values.copy()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert fingerprint(swapped) != base
