"""The hard-case table: every stored answer is found for its input (both signs where the
function is even or odd), no other input finds an answer, and the functions, which read
the table only near a rounding midpoint, still return every stored answer."""

import numpy as np

from sexpgpu import numerics as nx
from sexpgpu.numerics.portable import hardcases, ieee, polynomials, tables
from sexpgpu.numerics.portable import numpy_ops as K


def _lookup(name, bits):
    spec = getattr(tables, name.upper() + "_CASES")
    with np.errstate(over="ignore"):
        return tables.hard_case(np.asarray(bits, dtype=np.uint32), np.zeros(len(bits), np.uint32),
                                np.ones(len(bits), bool), tables.TABLE, spec)


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


def _keys_and_answers(name):
    """Every input whose answer the table holds, with that answer (both signs of |x| for
    the even and odd functions)."""
    cases = hardcases.HARD_CASES[name]
    keys = np.array(sorted(cases), dtype=np.uint32)
    answers = np.array([cases[k] for k in sorted(cases)], dtype=np.uint32)
    sign = np.uint32(0x80000000)
    if name in tables.ODD:
        return np.concatenate([keys, keys | sign]), np.concatenate([answers, answers ^ sign])
    if name in tables.EVEN:
        return np.concatenate([keys, keys | sign]), np.concatenate([answers, answers])
    return keys, answers


def test_functions_return_every_stored_answer():
    """The functions read the table only where ieee.near_midpoint flags the float64 value.
    Before, every lane read it, so results could change only at the table's keys; here
    every key still gets its stored answer, so no result changed anywhere."""
    for name in hardcases.HARD_CASES:
        keys, answers = _keys_and_answers(name)
        with np.errstate(all="ignore"):
            got = getattr(nx, name)(keys.view(np.float32)).view(np.uint32)
        assert np.array_equal(got, answers), (name, keys[got != answers])


def _failing_with_margin(monkeypatch, ulps):
    """The functions that miss a stored answer when near_midpoint's window is `ulps` wide."""
    monkeypatch.setattr(ieee, "NEAR_MIDPOINT_ULPS", ulps)
    wrong = set()
    for name in hardcases.HARD_CASES:
        keys, answers = _keys_and_answers(name)
        with np.errstate(all="ignore"):
            got = getattr(nx, name)(keys.view(np.float32)).view(np.uint32)
        if not np.array_equal(got, answers):
            wrong.add(name)
    return wrong


def test_the_midpoint_margin_is_needed(monkeypatch):
    """With no margin the check above fails (cos, sin, log and log1p hold keys that the
    float64 value rounds the wrong way within 1/4 float64 ulp of a midpoint; exp and erf,
    whose polynomials err by more, hold keys farther off), so it does test the margin; with
    1 ulp only exp and erf fail, and with 2^12 ulps none: a sixteenth of NEAR_MIDPOINT_ULPS."""
    window = ieee.NEAR_MIDPOINT_ULPS
    assert _failing_with_margin(monkeypatch, 0) == {"cos", "sin", "log", "log1p", "exp", "erf"}
    assert _failing_with_margin(monkeypatch, 1) == {"exp", "erf"}
    assert _failing_with_margin(monkeypatch, 2**12) == set()
    assert 2**12 * 16 == window


def test_float64_blocks_read_back():
    """exp's steps and erf's coefficients, as K.gather_f64 reads them from the table: by
    degree, then piece, for erf."""
    steps = K.gather_f64(tables.TABLE, tables.EXP_STEPS_AT + 2 * np.arange(64))
    assert np.array_equal(steps, np.array(polynomials.EXP_STEPS))
    pieces, count = tables.ERF_PIECES, tables.ERF_COEFFICIENT_COUNT
    index = tables.ERF_COEFFICIENTS_AT + 2 * (pieces * np.arange(count)[:, None] + np.arange(pieces))
    assert np.array_equal(K.gather_f64(tables.TABLE, index), np.array(polynomials.ERF_COEFFICIENTS).T)
    assert tables.EXP_STEPS_AT % 2 == 0 and tables.ERF_COEFFICIENTS_AT % 2 == 0


def test_each_recorded_attempt_is_the_first_collision_free_one():
    """tables.FIRST_FREE_ATTEMPT spares every process the search: the table it builds is the
    one the search from attempt 1 finds, and a function with new hard cases is searched anew."""
    for name, cases in hardcases.HARD_CASES.items():
        assert tables._slots(cases) == tables._slots(cases, tables.FIRST_FREE_ATTEMPT[name]), name
