"""Correctly rounded float32 elementwise functions, the same bits on CPU and CUDA.

Each takes a float32 numpy array (or numpy float32 scalar) or a float32 torch tensor on the
CPU or CUDA, and returns the same kind with the same shape (C-ordered, whatever the input's
strides). numpy arrays and CPU tensors run the numpy path; CUDA tensors run the same
algorithms compiled by Triton. Other dtypes or devices raise TypeError or ValueError.
"""

import math

import numpy as np

from sexpgpu.numerics import arrays, cpu
from sexpgpu.numerics.portable import erf as _erf
from sexpgpu.numerics.portable import exp as _exp
from sexpgpu.numerics.portable import log as _log
from sexpgpu.numerics.portable import pow as _pow
from sexpgpu.numerics.portable import roots as _roots
from sexpgpu.numerics.portable import trig as _trig


def _unary(fn, name: str, doc: str):
    """The public function `name`: `fn` on numpy arrays and CPU tensors, its Triton build on CUDA."""
    what = f"sexpgpu.numerics.{name}"

    def function(x):
        if arrays.kind(x, what) == "cuda":
            from sexpgpu.numerics import cuda

            return cuda.unary(fn.__name__, x.detach().contiguous())
        return arrays.like(cpu.elementwise(fn, arrays.as_numpy(x)), x)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc
    return function


exp = _unary(_exp.exp_f32, "exp", "e^x, correctly rounded.")
expm1 = _unary(_exp.expm1_f32, "expm1", "e^x - 1, correctly rounded.")
log = _unary(_log.log_f32, "log", "Natural logarithm, correctly rounded; NaN below 0, -inf at +-0.")
log1p = _unary(_log.log1p_f32, "log1p", "log(1 + x), correctly rounded; NaN below -1, -inf at -1.")
tanh = _unary(_exp.tanh_f32, "tanh", "Hyperbolic tangent, correctly rounded.")
sigmoid = _unary(_exp.sigmoid_f32, "sigmoid", "1 / (1 + e^-x), correctly rounded.")
erf = _unary(_erf.erf_f32, "erf", "The error function, correctly rounded.")
cos = _unary(_trig.cos_f32, "cos", "Cosine, correctly rounded, with exact argument reduction.")
sin = _unary(_trig.sin_f32, "sin", "Sine, correctly rounded, with exact argument reduction.")
rsqrt = _unary(_roots.rsqrt_f32, "rsqrt", "1 / sqrt(x), correctly rounded; +-inf at +-0, NaN below 0.")


def _exponent(y, kind, like, what):
    """y as an array or tensor of x's kind; a Python number must be a float32 value."""
    if isinstance(y, (int, float)) and not isinstance(y, bool):
        if not math.isnan(y) and float(np.float32(y)) != y:
            raise ValueError(f"{what}: the exponent {y!r} is not a float32 value; "
                             f"pass np.float32({y!r}) to round it first")
        y = np.float32(y)
        if kind == "numpy":
            return y
        return arrays.torch_module().tensor(y, device=like.device)
    if arrays.kind(y, what) != kind or (kind == "cuda" and y.device != like.device):
        raise TypeError(f"{what}: x and y must be the same kind of array on one device")
    return y


def pow(x, y):
    """x^y, the same bits on CPU and CUDA, within 1 ulp (see docs/numerics.md for where it
    is correctly rounded). y may be a Python number that is a float32 value."""
    what = "sexpgpu.numerics.pow"
    kind = arrays.kind(x, what)
    y = _exponent(y, kind, x, what)
    if kind == "cuda":
        from sexpgpu.numerics import cuda

        xb, yb = arrays.torch_module().broadcast_tensors(x.detach(), y.detach())
        return cuda.binary(_pow.pow_f32.__name__, xb.contiguous(), yb.contiguous())
    xb, yb = np.broadcast_arrays(arrays.as_numpy(x), arrays.as_numpy(y))
    out = cpu.elementwise(_pow.pow_f32, xb, yb)
    if kind == "torch":
        return arrays.torch_module().from_numpy(out)
    both_scalars = isinstance(x, np.generic) and isinstance(y, np.generic)
    return out[()] if both_scalars else out
