"""The hard-case table: every stored answer is found for its input (both signs where the
function is even or odd), and no other input finds an answer."""

import numpy as np

from sexpgpu.numerics.portable import hardcases, tables


def _lookup(name, bits):
    spec = getattr(tables, name.upper() + "_CASES")
    with np.errstate(over="ignore"):
        return tables.hard_case(np.asarray(bits, dtype=np.uint32), np.zeros(len(bits), np.uint32),
                                tables.TABLE, spec)


def test_every_answer_is_found():
    for name, cases in hardcases.HARD_CASES.items():
        keys = np.array(sorted(cases), dtype=np.uint32)
        answers = np.array([cases[k] for k in sorted(cases)], dtype=np.uint32)
        assert np.array_equal(_lookup(name, keys), answers), name
        negative = keys | np.uint32(0x80000000)
        if name in tables.ODD:
            assert np.array_equal(_lookup(name, negative), answers ^ np.uint32(0x80000000)), name
        if name in tables.EVEN:
            assert np.array_equal(_lookup(name, negative), answers), name


def test_other_inputs_find_nothing():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 0x7F800000, 200_000, dtype=np.uint32)
    for name, cases in hardcases.HARD_CASES.items():
        others = bits[~np.isin(bits & np.uint32(0x7FFFFFFF), np.array(sorted(cases), np.uint32))]
        assert not _lookup(name, others).any(), name
    assert len(hardcases.HARD_CASES["log"]) >= 50 and len(hardcases.HARD_CASES["rsqrt"]) >= 100
