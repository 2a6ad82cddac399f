"""Launch the Triton kernels: on CUDA tensors, or on CPU tensors in Triton's interpreter.

Every launch passes enable_fp_fusion=False, so no multiply and add are contracted into a
fused multiply-add; float64 division and square root lower to div.rn.f64 and sqrt.rn.f64.
"""

import contextlib
import functools

import numpy as np

from . import retarget
from .portable import tables

BLOCK = 512
NUM_WARPS = 4


def interpreting():
    import triton

    return bool(triton.knobs.runtime.interpret)


_build = {"hardware": True}


def compiled():
    """The namespace of jitted functions and kernels for the current Triton mode."""
    return retarget.namespace(interpreting(), _build["hardware"])


@contextlib.contextmanager
def portable_build():
    """Inside the block every GPU function and draw runs the portable code alone, the
    previous build (retarget.namespace(..., hardware=False)): the oracle and the baseline
    of bench/verify_numerics_speed.py. Not for concurrent use."""
    _build["hardware"] = False
    try:
        yield
    finally:
        _build["hardware"] = True


@functools.cache
def _table(device):
    import torch

    return torch.from_numpy(tables.TABLE.view(np.int32).copy()).to(device)


def launch(kernel, n, *args, **constants):
    if n == 0:
        return
    ns = compiled()
    grid = ((n + BLOCK - 1) // BLOCK,)
    ns[kernel][grid](*args, BLOCK=BLOCK, num_warps=NUM_WARPS, enable_fp_fusion=False,
                     **constants)


def unary(name, x):
    """The portable function `name` (e.g. "exp_f32") of a contiguous float32 tensor."""
    import torch

    out = torch.empty_like(x)
    launch("unary_kernel", x.numel(), x, out, x.numel(), _table(x.device), FN=compiled()[name])
    return out


def binary(name, x, y):
    import torch

    out = torch.empty_like(x)
    launch("binary_kernel", x.numel(), x, y, out, x.numel(), _table(x.device),
           FN=compiled()[name])
    return out


def philox(counter, key):
    """Philox blocks of contiguous int32 views of (n, 4) counters and (n, 2) keys."""
    import torch

    out = torch.empty_like(counter)
    launch("philox_kernel", counter.shape[0], counter, key, out, counter.shape[0])
    return out


def draw(kernel, shape, dtype, device, args):
    """A draw kernel's output of `shape`; args are the int64 words the kernel reads."""
    import torch

    out = torch.empty(shape, dtype=dtype, device=device)
    words = torch.tensor(args, dtype=torch.int64).to(device)
    launch(kernel, out.numel(), out, out.numel(), words)
    return out
