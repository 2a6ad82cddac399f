"""Stand-ins for math functions the numerics library does not offer as Triton functions yet.

They are accurate to a few ulps, not correctly rounded, so a kernel using them matches the
CPU interpreter within tolerance rather than bit for bit (see mathlib.missing()). On a GPU
they call CUDA's libdevice; Triton's interpreter cannot run libdevice, so there they use
Triton's own functions, which the interpreter evaluates with numpy.
"""

import os

import triton
import triton.language as tl

if os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def exp(x):
        return tl.exp(x)

    @triton.jit
    def log(x):
        return tl.log(x)

    @triton.jit
    def tanh(x):
        # tanh(|x|) = (1 - e^(-2|x|)) / (1 + e^(-2|x|)), then the sign of x.
        e = tl.exp(-2.0 * tl.abs(x))
        t = tl.div_rn(1.0 - e, 1.0 + e)
        return tl.where(x < 0.0, -t, t)

    @triton.jit
    def erf(x):
        return tl.math.erf(x)

    @triton.jit
    def pow(x, y):
        return tl.exp(y * tl.log(x))
else:
    from triton.language.extra import libdevice

    @triton.jit
    def exp(x):
        return libdevice.exp(x)

    @triton.jit
    def log(x):
        return libdevice.log(x)

    @triton.jit
    def tanh(x):
        return libdevice.tanh(x)

    @triton.jit
    def erf(x):
        return libdevice.erf(x)

    @triton.jit
    def pow(x, y):
        return libdevice.pow(x, y)


@triton.jit
def sigmoid(x):
    return tl.div_rn(1.0, 1.0 + exp(-x))


@triton.jit
def rsqrt(x):
    return tl.div_rn(1.0, tl.sqrt_rn(x))
