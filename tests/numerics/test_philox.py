"""Philox4x32-10 against Random123's published known-answer vectors and an independent
pure-Python implementation (numerics_reference.philox_reference)."""

import numpy as np
import pytest

from numerics_reference import philox_reference
from sexpgpu import numerics as nx

# Random123 1.14, examples/kat_vectors, lines "philox4x32 10 <counter x4> <key x2> <out x4>"
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_known_answer_vectors(counter, key, expected):
    out = nx.philox4x32(np.array(counter, np.uint32), np.array(key, np.uint32))
    assert tuple(int(w) for w in out) == expected
    assert philox_reference(counter, key) == expected


def test_matches_reference_on_random_blocks():
    rng = np.random.default_rng(20261129)
    counters = rng.integers(0, 2**32, (500, 4), dtype=np.uint64).astype(np.uint32)
    keys = rng.integers(0, 2**32, (500, 2), dtype=np.uint64).astype(np.uint32)
    out = nx.philox4x32(counters, keys)
    for c, k, o in zip(counters, keys, out):
        assert tuple(int(w) for w in o) == philox_reference(tuple(map(int, c)), tuple(map(int, k)))


def test_leading_shapes_broadcast():
    counters = np.arange(24, dtype=np.uint32).reshape(2, 3, 4)
    key = np.array([7, 9], np.uint32)
    out = nx.philox4x32(counters, key)
    assert out.shape == (2, 3, 4) and out.dtype == np.uint32
    assert np.array_equal(out[1, 2], nx.philox4x32(counters[1, 2], key))


def test_torch_cpu_gives_the_same_words():
    torch = pytest.importorskip("torch")
    counter, key, expected = KAT[2]
    out = nx.philox4x32(torch.tensor(counter, dtype=torch.uint32), torch.tensor(key, dtype=torch.uint32))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.uint32
    assert tuple(int(w) for w in out.numpy()) == expected


def test_rejects_other_dtypes_and_shapes():
    with pytest.raises(TypeError, match="uint32"):
        nx.philox4x32(np.zeros(4, np.int64), np.zeros(2, np.uint32))
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        nx.philox4x32(np.zeros(3, np.uint32), np.zeros(2, np.uint32))
    with pytest.raises(ValueError, match="broadcast"):
        nx.philox4x32(np.zeros((3, 4), np.uint32), np.zeros((2, 2), np.uint32))
