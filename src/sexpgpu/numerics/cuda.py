"""Launch the Triton kernels: on CUDA tensors, or on CPU tensors in Triton's interpreter.

Every launch passes enable_fp_fusion=False, so no multiply and add are contracted into a
fused multiply-add; float64 division and square root lower to div.rn.f64 and sqrt.rn.f64.
"""

import contextlib
import functools

import numpy as np

from sexpgpu.numerics import retarget
from sexpgpu.numerics.portable import tables

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


def draw(spec, shape, device, key_words):
    """A new tensor of `shape` on `device`: the draw `spec` (sampling.DrawSpec) under one key."""
    import torch

    out = torch.empty(shape, dtype=getattr(torch, TORCH_DTYPES[spec.dtype]), device=device)
    args = torch.tensor([list(key_words) + list(spec.words)], dtype=torch.int64).to(device)
    draw_into(spec, out, args)
    return out


# the result's torch dtype for each numpy one (the kernels store a bool as a uint8)
TORCH_DTYPES = {np.float32: "float32", np.int32: "int32", np.bool_: "bool"}


def draw_into(spec, out, args, rows=1, copies=1):
    """The draw `spec` into the contiguous tensor `out`, rows of n = out.numel() / (rows
    copies) elements, each written `copies` times in a row: row r is the draw of n elements
    under the key of args row r (an int64 (rows, 2 + len(spec.words)) tensor). Launches one
    kernel and nothing else, so a CUDA graph can capture it."""
    import torch

    n = out.numel() // (rows * copies)
    if n == 0:
        return
    storage = out.view(torch.uint8) if out.dtype == torch.bool else out
    grid = (rows * ((n + BLOCK - 1) // BLOCK),)
    compiled()[spec.kernel][grid](storage, n, args, args.stride(0), BLOCK=BLOCK, COPIES=copies,
                                  num_warps=NUM_WARPS, enable_fp_fusion=False)


SALT_SLOTS = 4  # salts one fold_keys_kernel launch folds in; more take further launches
KEY_BLOCK = 128


def fold_keys(template, salts, out):
    """Row r of `out` (int64, (rows, words)): the one row of `template` (int64, (1, words))
    with each salt folded into its key in order: a 0-d salt into every row's, a vector salt's
    element r into row r's. Salts are int32 or int64 tensors; no value leaves the device."""
    rows, words = out.shape
    if not salts:
        out.copy_(template.expand(rows, words))
    source, source_stride = template, 0
    for first in range(0, len(salts), SALT_SLOTS):
        group = salts[first:first + SALT_SLOTS]
        slots = [(salt, salt.stride(0) if salt.dim() else 0) for salt in group]
        slots += [slots[0]] * (SALT_SLOTS - len(slots))  # unread: SALTS says how many are
        grid = ((rows + KEY_BLOCK - 1) // KEY_BLOCK,)
        compiled()["fold_keys_kernel"][grid](source, source_stride, out, rows,
                                             *[value for slot in slots for value in slot],
                                             SALTS=len(group), WORDS=words, BLOCK=KEY_BLOCK,
                                             num_warps=1, enable_fp_fusion=False)
        source, source_stride = out, words
