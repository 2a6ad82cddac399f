"""The GPU build's replacements (numerics/triton_exact.py) and its midpoint-gated table reads,
in Triton's interpreter, against the portable code: the conversions on every kind of
float32 and float64 value, round_f32 on midpoints with every sign of lo, and whole functions
on the inputs where the replacements could differ. The compiled build is checked against the
portable build on all 2^32 inputs by bench/verify_numerics_speed.py (needs a GPU)."""

from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from sexpgpu.numerics import cpu, cuda, retarget  # noqa: E402
from sexpgpu.numerics.portable import exp, hardcases, ieee  # noqa: E402
from sexpgpu.numerics.portable import erf, log, roots, trig  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
BLOCK = 256
UNARY = {"exp": exp.exp_f32, "expm1": exp.expm1_f32, "log": log.log_f32, "log1p": log.log1p_f32,
         "tanh": exp.tanh_f32, "sigmoid": exp.sigmoid_f32, "erf": erf.erf_f32,
         "cos": trig.cos_f32, "sin": trig.sin_f32, "rsqrt": roots.rsqrt_f32}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert cuda.interpreting()


def _widen(bits_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bits = tl.load(bits_ptr + offsets, mask=offsets < n, other=0).to(tl.uint32, bitcast=True)
    tl.store(out_ptr + offsets, FN(bits).to(tl.int64, bitcast=True), mask=offsets < n)


def _round(hi_ptr, lo_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    hi = tl.load(hi_ptr + offsets, mask=offsets < n, other=0).to(tl.float64, bitcast=True)
    lo = tl.load(lo_ptr + offsets, mask=offsets < n, other=0).to(tl.float64, bitcast=True)
    tl.store(out_ptr + offsets, FN(hi, lo).to(tl.int32, bitcast=True), mask=offsets < n)


def _run(kernel, fn_name, hardware, out_dtype, *arrays):
    ns = retarget.namespace(True, hardware)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    out = torch.empty(len(arrays[0]), dtype=out_dtype)
    grid = ((len(arrays[0]) + BLOCK - 1) // BLOCK,)
    triton.jit(kernel)[grid](*tensors, out, len(arrays[0]), FN=ns[fn_name], BLOCK=BLOCK)
    return out.numpy()


def float32_edges():
    """Zeros, subnormals, binade edges of every exponent, FLT_MAX, infinities, NaNs with
    several payloads, the clamps' bounds and their neighbours, each with both signs."""
    exponents = np.arange(256, dtype=np.uint32) << 23
    edges = np.concatenate([exponents, exponents | 1, exponents | 0x7FFFFF, exponents | 0x400000])
    subnormal = np.array([1, 2, 3, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF], np.uint32)
    nans = np.array([0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0x7FC00001, 0x7FFFFFFF, 0x7FA5A5A5],
                    np.uint32)
    bounds = np.array([100.0, 110.0, 20.0, 4.0, 2.0**-11], np.float32)  # the clamps' bounds
    near_bounds = np.concatenate([bounds, np.nextafter(bounds, np.float32(0)),
                                  np.nextafter(bounds, np.float32(np.inf))]).view(np.uint32)
    rng = np.random.default_rng(5)
    random = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)
    positive = np.concatenate([edges, subnormal, nans, near_bounds])
    return np.unique(np.concatenate([positive, positive | np.uint32(0x80000000), random]))


def test_widening_equals_the_portable_conversion():
    bits = float32_edges()
    new = _run(_widen, "f32_to_f64", True, torch.int64, bits.view(np.int32))
    old = _run(_widen, "f32_to_f64", False, torch.int64, bits.view(np.int32))
    new_f, old_f = new.view(np.float64), old.view(np.float64)
    nan = np.isnan(old_f)
    assert np.array_equal(np.isnan(new_f), nan)
    assert np.array_equal(new[~nan], old[~nan])
    assert nan.sum() >= 12 and np.count_nonzero(new_f[~nan] == 0) == 2


def _f64(values):
    return np.array(values, dtype=np.float64)


def round_cases():
    """(hi, lo): float32 midpoints (normal and subnormal, both signs, FLT_MAX + ulp/2 and
    2^-150 among them) and their float64 neighbours, with lo zero, of either sign, of
    magnitude ulp/2 or tiny; exact floats32, zeros, infinities, NaN, overflow, underflow."""
    rng = np.random.default_rng(11)
    f32 = rng.integers(1, 0x7F7FFFFF, 300, dtype=np.uint32)
    f32 = np.concatenate([f32, np.array([0, 1, 2, 0x7FFFFF, 0x800000, 0x7F7FFFFE, 0x7F7FFFFF],
                                        np.uint32)])
    low = f32.view(np.float32).astype(np.float64)
    high = np.nextafter(f32.view(np.float32), np.float32(np.inf)).astype(np.float64)
    high[f32 == 0x7F7FFFFF] = 2.0**128
    mid = low + (high - low) / 2  # exact: one more bit
    his = [mid, np.nextafter(mid, 0), np.nextafter(mid, np.inf), low,
           _f64([0.0, np.inf, np.nan, 1e300, 2.0**-151, 2.0**-1074, 2.0**-150])]
    hi = np.concatenate(his)
    hi = np.concatenate([hi, -hi])
    ulp = np.abs(np.nextafter(hi, np.inf) - hi)
    ulp[~np.isfinite(ulp)] = 0.0
    los = [np.zeros_like(hi), ulp / 2, -ulp / 2, ulp / 8, -ulp / 8, np.full_like(hi, 2.0**-1074)]
    return np.tile(hi, len(los)), np.concatenate(los)


def test_round_f32_equals_the_portable_rounding():
    hi, lo = round_cases()
    new = _run(_round, "round_f32", True, torch.int32, hi.view(np.int64), lo.view(np.int64))
    old = _run(_round, "round_f32", False, torch.int32, hi.view(np.int64), lo.view(np.int64))
    assert np.array_equal(new, old)
    ties = hi.view(np.int64) & 0x1FFFFFFF == 0x10000000
    assert np.count_nonzero(ties & (lo != 0)) > 1000  # the tie rule is exercised


def _near_by_fractions(y):
    """near_midpoint from its definition, in exact arithmetic: |y| in [2^-151, 2^-126), or
    |y| >= 2^-126 within NEAR_MIDPOINT_ULPS float64 ulps of y of a float32 midpoint."""
    a = Fraction(abs(float(y)))
    if a < Fraction(1, 2**126):
        return a >= Fraction(1, 2**151)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e = e if a >= Fraction(2) ** e else e - 1  # 2^e <= a < 2^(e+1)
    ulp32, ulp64 = Fraction(2) ** (e - 23), Fraction(2) ** (e - 52)
    below = (a // ulp32) * ulp32
    return abs(a - (below + ulp32 / 2)) < ieee.NEAR_MIDPOINT_ULPS * ulp64


def test_near_midpoint_matches_its_definition():
    hi, _ = round_cases()
    hi = hi[np.isfinite(hi) & ((np.abs(hi) >= 2.0**-1022) | (hi == 0))]
    ulp = np.abs(np.nextafter(hi, np.inf) - hi)
    steps = float(ieee.NEAR_MIDPOINT_ULPS)
    y = np.concatenate([hi, hi + (steps - 1) * ulp, hi + steps * ulp, hi - (steps - 1) * ulp,
                        hi - steps * ulp, hi + 2**20 * ulp])
    with np.errstate(all="ignore"):
        got = ieee.near_midpoint(y)
    want = np.array([_near_by_fractions(v) for v in y])
    assert np.array_equal(got, want)
    assert 0.2 < want.mean() < 0.9


def sigmoid_ties():
    """Inputs |x| < 2^-11 where 1/2 + x/4 is exactly a float32 midpoint, so that the x^3
    term (round_f32's lo) decides: x = (2k+1) 2^-23 and x = -(2k+1) 2^-24."""
    k = np.arange(0, 2**12, 7, dtype=np.float64)
    x = np.concatenate([(2 * k + 1) * 2.0**-23, -(2 * k + 1) * 2.0**-24]).astype(np.float32)
    return x[np.abs(x) < 2.0**-11]


@pytest.mark.parametrize("name", sorted(UNARY))
def test_functions_equal_numpy_on_edges(name):
    x = np.concatenate([float32_edges(), sigmoid_ties().view(np.uint32)]).view(np.float32)
    got = cuda.unary(UNARY[name].__name__, torch.from_numpy(x.copy())).numpy()
    assert np.array_equal(got.view(np.uint32), cpu.elementwise(UNARY[name], x).view(np.uint32))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_gated_table_reads_equal_the_previous_build_on_every_key(name):
    """The GPU build against the portable build (every lane reading the table, no gate) in
    the interpreter, on each table key with both signs: the only inputs where the gate
    could matter."""
    keys = np.array(sorted(hardcases.HARD_CASES[name]), dtype=np.uint32)
    x = np.concatenate([keys, keys | np.uint32(0x80000000)]).view(np.float32)
    new = cuda.unary(UNARY[name].__name__, torch.from_numpy(x.copy())).numpy()
    with cuda.portable_build():
        old = cuda.unary(UNARY[name].__name__, torch.from_numpy(x.copy())).numpy()
    assert np.array_equal(new.view(np.uint32), old.view(np.uint32))
