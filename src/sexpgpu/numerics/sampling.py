"""Draws: stateless samples that are pure functions of (key, element index).

Element i of the result (its C-order flat index) reads words of the Philox block with
counter (b mod 2^32, b >> 32, attempt, 0) under the key, b = i div 4 for uniform and
bernoulli draws and i div 2 for normal and randint draws; docs/numerics.md gives each
distribution's transform. device=None returns a numpy array; a torch device returns a
tensor there (a CPU tensor is computed by numpy, a CUDA one by the Triton kernels, with the
same bits).
"""

import math
import numbers

import numpy as np

from . import arrays, cpu
from .keys import Key
from .portable import draws

MIN_BOUND = 0.1
INT32_MIN, INT32_LIMIT = -(2**31), 2**31


def _shape(shape, what):
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise TypeError(f"{what}: shape must be a tuple of non-negative ints, got {shape!r}")
    return tuple(int(d) for d in shape)


def _real(value, name, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{what}: {name} must be a finite number, got {value!r}")
    return float(value)


def _key(key, what):
    if not isinstance(key, Key):
        raise TypeError(f"{what}: key must be a sexpgpu.numerics.Key (from stream_key or "
                        f"fold_in), got {type(key).__name__}")
    return key.words


def _f64_bits(value):
    return int(np.float64(value).view(np.int64))


def _f32_bits(value):
    return int(np.float32(value).view(np.uint32))


def _run(kernel, blocks_fn, per_block, shape, dtype, device, key, cpu_params, cuda_params):
    n = math.prod(shape)
    if device is not None and device.type == "cuda":
        from . import cuda

        torch = arrays.torch_module()
        torch_dtype = {np.float32: torch.float32, np.int32: torch.int32, np.bool_: torch.uint8}
        out = cuda.draw(kernel, shape, torch_dtype[dtype], device, list(key) + cuda_params)
        return out.view(torch.bool) if dtype is np.bool_ else out
    out = cpu.draw(blocks_fn, per_block, n, np.uint32 if dtype is np.float32 else dtype, key,
                   *cpu_params)
    if dtype is np.float32:
        out = out.view(np.float32)
    out = out.reshape(shape)
    return out if device is None else arrays.torch_module().from_numpy(out)


def _float32_inside(low, high):
    """The smallest float32 >= low and the largest float32 < high, as bits."""
    lo = np.float32(low)
    if float(lo) < low:
        lo = np.nextafter(lo, np.float32(np.inf))
    hi = np.float32(high)
    if float(hi) >= high:
        hi = np.nextafter(hi, np.float32(-np.inf))
    return _f32_bits(lo), _f32_bits(hi)


def uniform(key, shape, low=0.0, high=1.0, device=None):
    """float32 in [low, high): low + (high - low) u rounded, u = (w >> 8) 2^-24 for the
    element's word w (word i mod 4 of block i div 4).

    With the defaults the result is u itself, a multiple of 2^-24 below 1; a value that
    rounds outside [low, high) becomes the nearest float32 inside it.
    """
    what = "sexpgpu.numerics.uniform"
    words, shape = _key(key, what), _shape(shape, what)
    low, high = _real(low, "low", what), _real(high, "high", what)
    if not low < high:
        raise ValueError(f"{what}: low must be below high, got low={low} high={high}")
    caps = _float32_inside(low, high)
    if np.array(caps, dtype=np.uint32).view(np.float32)[0] > np.array(caps, dtype=np.uint32).view(np.float32)[1]:
        raise ValueError(f"{what}: no float32 lies in [{low}, {high})")
    device = arrays.resolve_device(device, what)
    return _run("uniform_kernel", draws.uniform_f32, 4, shape, np.float32, device, words,
                [low, high, caps[0], caps[1]],
                [_f64_bits(low), _f64_bits(high), caps[0], caps[1]])


def normal(key, shape, mean=0.0, std=1.0, device=None):
    """float32 mean + std z, z a Box-Muller standard normal in float64, rounded once;
    elements 2b and 2b + 1 are the cosine and sine normals of block b."""
    what = "sexpgpu.numerics.normal"
    words, shape = _key(key, what), _shape(shape, what)
    mean, std = _real(mean, "mean", what), _real(std, "std", what)
    if std < 0:
        raise ValueError(f"{what}: std must not be negative, got {std}")
    device = arrays.resolve_device(device, what)
    return _run("normal_kernel", draws.normal_f32, 2, shape, np.float32, device, words,
                [mean, std], [_f64_bits(mean), _f64_bits(std)])


def truncated_normal(key, shape, mean=0.0, std=1.0, bound=2.0, device=None):
    """Like normal, but each element redraws (attempt 1, 2, ...) until |z| <= bound.

    bound is in standard deviations and must be at least 0.1 (each element takes about
    1 / P(|z| <= bound) attempts).
    """
    what = "sexpgpu.numerics.truncated_normal"
    words, shape = _key(key, what), _shape(shape, what)
    mean, std = _real(mean, "mean", what), _real(std, "std", what)
    bound = _real(bound, "bound", what)
    if std < 0:
        raise ValueError(f"{what}: std must not be negative, got {std}")
    if bound < MIN_BOUND:
        raise ValueError(f"{what}: bound must be at least {MIN_BOUND} standard deviations, "
                         f"got {bound}")
    device = arrays.resolve_device(device, what)

    def blocks(b_lo, b_hi, k0, k1):
        return draws.scaled_f32(cpu.truncated_normal_pairs(b_lo, b_hi, k0, k1, bound), mean, std)

    return _run("truncated_normal_kernel", blocks, 2, shape, np.float32, device, words, [],
                [_f64_bits(mean), _f64_bits(std), _f64_bits(bound)])


def bernoulli(key, shape, p, device=None):
    """bool, True where the element's word (i mod 4 of block i div 4) is below
    round(p 2^32): True with probability round(p 2^32) / 2^32."""
    what = "sexpgpu.numerics.bernoulli"
    words, shape = _key(key, what), _shape(shape, what)
    p = _real(p, "p", what)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{what}: p must lie in [0, 1], got {p}")
    threshold = round(p * 2**32)
    device = arrays.resolve_device(device, what)
    return _run("bernoulli_kernel", draws.bernoulli, 4, shape, np.bool_, device, words,
                [threshold], [threshold])


def randint(key, shape, low, high, device=None):
    """int32 in [low, high): low + floor(u (high - low)), u = (w0 2^32 + w1) 2^-64 for even
    elements and (w2 2^32 + w3) 2^-64 for odd ones, of block i div 2.

    Each value's probability is within 2^-32 relative of 1 / (high - low).
    """
    what = "sexpgpu.numerics.randint"
    words, shape = _key(key, what), _shape(shape, what)
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{what}: {name} must be an int, got {v!r}")
    low, high = int(low), int(high)
    if not INT32_MIN <= low < high <= INT32_LIMIT:
        raise ValueError(f"{what}: need -2^31 <= low < high <= 2^31, got low={low} high={high}")
    device = arrays.resolve_device(device, what)
    return _run("randint_kernel", draws.randint_i32, 2, shape, np.int32, device, words,
                [low, high - low], [low, high - low])
