"""Triton-only replacements of portable functions by hardware operations with the same result.

retarget.py compiles each function here in place of the portable function of the same name
(the numpy path keeps the portable one). A replacement is allowed only where IEEE 754
defines one result and the hardware instruction gives it: NVIDIA's cvt.f64.f32 and
cvt.rn.f32.f64 without .ftz are exact and correctly rounded conversions, subnormals
included (test_ptx.py checks that no .ftz appears), and float32 max and min of floats32
are exact. The integer versions exist because the portable code cannot rely on every
device's conversions; on the GPU they cost tens of 64-bit integer operations an element.
Each is checked bit for bit against the portable function in Triton's interpreter
(test_triton_exact.py) and, compiled, on all 2^32 inputs of every function
(bench/verify_numerics_speed.py). Like triton_wrappers.py, the code uses the shared namespace of
retarget.py: K, the portable functions and constants.
"""

import triton.language as tl

TWO_P149_EXACT = 2.0**149


def f32_to_f64(bits):
    """The float64 equal to the float32 with these bits. Same value as the portable version
    for every non-NaN input (widening is exact); a NaN stays a NaN but may keep another
    payload or sign. No caller can see that: every function answers 0x7FC00000 for a NaN
    input, and before that a NaN meets only comparisons (false whatever its bits), clamp
    (which maps it to 0), absolute and round_f32 (both NaN out for any NaN)."""
    return bits.to(tl.float32, bitcast=True).to(tl.float64)


def nearest_f32(y):
    """float32 bits (uint32) of y rounded to nearest even: what the portable round_f32(y, 0.0)
    computes for every non-NaN y (gradual underflow, overflow to infinity from
    FLT_MAX + ulp/2 on, signed zeros kept)."""
    return y.to(tl.float32).to(tl.uint32, bitcast=True)


def is_midpoint(hi):
    """Whether hi is exactly halfway between two adjacent float32 values (or 0 and 2^-149),
    the portable round_f32's own test: the 29 dropped bits are 1 then zeros for a normal
    result; for a subnormal one, hi 2^149 (exact) has fraction 1/2."""
    b = K.f64_bits(hi)
    high = K.i32(b >> 32) & 0x7FFFFFFF
    normal_tie = K.i32(b & 0x1FFFFFFF) == MIDPOINT_REST
    scaled = K.where(high < MIN_NORMAL_F64_HIGH, absolute(hi) * TWO_P149_EXACT, 0.0)
    small_tie = scaled - scaled.to(tl.int32).to(tl.float64) == 0.5  # scaled < 2^23
    return K.where(high < MIN_NORMAL_F64_HIGH, small_tie, normal_tie)


def round_f32(hi, lo):
    """The portable round_f32 by hardware rounding. Off a midpoint, hi + lo rounds as hi does
    (the portable rule ignores lo there). At a midpoint the portable rule rounds away from
    zero when lo has hi's sign and towards zero when it has the other; moving hi one
    float64 step that way gives the same float32, as no float32 and no other midpoint lies
    within a float64 step of a midpoint. With lo the constant 0.0 (nearly every caller)
    Triton folds the tie handling away. The hardware's NaN may differ from the portable
    0x7FC00000, hence the last where."""
    tie = (lo != 0.0) & is_midpoint(hi)
    step = tl.where((lo > 0.0) == (hi > 0.0), 1, -1)
    moved = K.f64_from_bits(K.f64_bits(hi) + tl.where(tie, step, 0))
    return tl.where(hi != hi, QUIET_NAN, nearest_f32(moved))



def clamp_f32(x, bits, low, high):
    """The portable clamp_f32 by float32 max and min of the input's bits, then the exact
    widening: one instruction each, where float64 has no min or max instruction. The bounds
    are floats32 and comparisons of floats32 decide alike in either width, so every non-NaN
    input, -0 included (no bound is 0 unless the input is |x|, never -0), gives the same
    value. A NaN becomes a bound instead of 0: every caller answers 0x7FC00000 for a NaN
    input, and a bound is as defined for the integer conversions downstream."""
    v = bits.to(tl.float32, bitcast=True)
    return tl.minimum(tl.maximum(v, low), high).to(tl.float64)
