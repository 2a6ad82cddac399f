"""The portable math of sexpgpu.numerics as device functions of generated kernels.

numerics compiles its float64 algorithms for Triton (numerics/retarget.py); each takes and
returns float32 bits and reads one uint32 table. These wrappers give them float32 values,
so a generated kernel's exp, log, tanh, erf, sigmoid, rsqrt and pow are the CPU
interpreter's bit for bit. A kernel that calls one takes the table as its last argument
(`tab`), which `Launch` passes (see `table`).
"""

import functools

import numpy as np
import triton
import triton.language as tl

from sexpgpu.numerics import cuda as _numerics

_compiled = _numerics.compiled()
_exp = _compiled["exp_f32"]
_log = _compiled["log_f32"]
_tanh = _compiled["tanh_f32"]
_erf = _compiled["erf_f32"]
_sigmoid = _compiled["sigmoid_f32"]
_rsqrt = _compiled["rsqrt_f32"]
_pow = _compiled["pow_f32"]


@triton.jit
def exp(x, tab):
    return _exp(x.to(tl.uint32, bitcast=True), tab).to(tl.float32, bitcast=True)


@triton.jit
def log(x, tab):
    return _log(x.to(tl.uint32, bitcast=True), tab).to(tl.float32, bitcast=True)


@triton.jit
def tanh(x, tab):
    return _tanh(x.to(tl.uint32, bitcast=True), tab).to(tl.float32, bitcast=True)


@triton.jit
def erf(x, tab):
    return _erf(x.to(tl.uint32, bitcast=True), tab).to(tl.float32, bitcast=True)


@triton.jit
def sigmoid(x, tab):
    return _sigmoid(x.to(tl.uint32, bitcast=True), tab).to(tl.float32, bitcast=True)


@triton.jit
def rsqrt(x, tab):
    return _rsqrt(x.to(tl.uint32, bitcast=True), tab).to(tl.float32, bitcast=True)


@triton.jit
def pow(x, y, tab):
    x, y = tl.broadcast(x, y)
    return _pow(x.to(tl.uint32, bitcast=True), y.to(tl.uint32, bitcast=True), tab).to(tl.float32, bitcast=True)


@functools.cache
def table(device):
    """The numerics table on `device`, made once."""
    import torch

    from sexpgpu.numerics.portable import tables

    return torch.from_numpy(np.asarray(tables.TABLE).view(np.int32).copy()).to(device)
