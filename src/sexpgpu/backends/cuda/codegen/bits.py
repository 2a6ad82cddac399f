"""Bit-level helpers shared by generated kernels."""

import triton
import triton.language as tl


@triton.jit
def round_bf16(x):
    """float32 to the nearest bfloat16 value, ties to even, returned as float32. Written
    on the bits so that the GPU and Triton's interpreter (which truncates) agree; NaN stays
    NaN and a value past the largest bf16 rounds to infinity, as in the CPU interpreter."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 32767 + ((bits >> 16) & 1)) >> 16) << 16
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def store_bf16(x):
    """float32 to a bfloat16 tensor, rounded to nearest even, through the bits (exact for
    subnormals in the interpreter too)."""
    bits = round_bf16(x).to(tl.uint32, bitcast=True)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def load_bf16(x):
    """A loaded bfloat16 tensor as the float32 values it holds, through the bits."""
    bits = x.to(tl.uint16, bitcast=True).to(tl.uint32)
    return (bits << 16).to(tl.float32, bitcast=True)


@triton.jit
def max_nan(a, b):
    """max that keeps NaN, as numpy's maximum does (Triton's own max drops it)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def add(a, b):
    return a + b
