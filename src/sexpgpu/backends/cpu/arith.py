"""The interpreter's two arithmetics.

`PortableF32` is the one runs use: float32 arrays, IEEE + - * / and sqrt from numpy, and
every other function from sexpgpu.numerics, whose results do not depend on the machine.
Nodes of dtype bf16 hold float32 arrays rounded to nearest even into bfloat16.

`ReferenceF64` is a test oracle only: the same kernels in float64 with numpy's own
functions and no bf16 rounding, so that gradient rules can be checked against finite
differences without float32 noise. Its bits are not portable and no run uses it.
"""

from __future__ import annotations

import math

import numpy as np

from sexpgpu import numerics as nx
from sexpgpu.backends.cpu.parallel import elementwise


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as a float32 array. NaN stays NaN (quiet)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    nan = np.isnan(x)
    if np.any(nan):
        rounded = np.where(nan, (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000), rounded)
    return rounded.astype(np.uint32).view(np.float32).reshape(x.shape)


class PortableF32:
    name = "f32"
    float_dtype = np.float32
    rounds_bf16 = True

    @staticmethod
    def numpy_dtype(dtype: str):
        return {"f32": np.float32, "bf16": np.float32, "i32": np.int32, "bool": np.bool_}[dtype]

    def pow(self, x, y):
        return elementwise(nx.pow, np.asarray(x, np.float32), np.asarray(y, np.float32)).astype(np.float32, copy=False)


def _portable(name: str):
    def function(self, x):
        return elementwise(getattr(nx, name), np.asarray(x, dtype=np.float32)).astype(np.float32, copy=False)

    function.__name__ = name
    return function


for _name in ("exp", "log", "tanh", "sigmoid", "erf", "rsqrt"):
    setattr(PortableF32, _name, _portable(_name))


_erf64 = np.vectorize(math.erf, otypes=[np.float64])


class ReferenceF64:
    name = "f64"
    float_dtype = np.float64
    rounds_bf16 = False

    @staticmethod
    def numpy_dtype(dtype: str):
        return {"f32": np.float64, "bf16": np.float64, "i32": np.int32, "bool": np.bool_}[dtype]

    def exp(self, x):
        return np.exp(x)

    def log(self, x):
        return np.log(x)

    def tanh(self, x):
        return np.tanh(x)

    def sigmoid(self, x):
        return 1.0 / (1.0 + np.exp(-x))

    def erf(self, x):
        return _erf64(x)

    def rsqrt(self, x):
        return 1.0 / np.sqrt(x)

    def pow(self, x, y):
        return np.power(x, y)
