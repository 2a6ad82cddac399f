"""Draws: stateless samples that are pure functions of (key, element index).

Element i of the result (its C-order flat index) reads words of the Philox block with
counter (b mod 2^32, b >> 32, attempt, 0) under the key, b = i div 4 for uniform and
bernoulli draws and i div 2 for normal and randint draws; docs/numerics.md gives each
distribution's transform. device=None returns a numpy array; a torch device returns a
tensor there (a CPU tensor is computed by numpy, a CUDA one by the Triton kernels, with the
same bits).
"""

import difflib
import inspect
import math
import numbers
import typing

import numpy as np

from sexpgpu.numerics import arrays, cpu
from sexpgpu.numerics.keys import Key
from sexpgpu.numerics.portable import draws

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


class DrawSpec(typing.NamedTuple):
    """A distribution with its parameters checked: all a draw needs beside its key and shape."""

    kernel: str  # the Triton kernel (triton_wrappers.py)
    blocks: object  # the numpy path: blocks(b_lo, b_hi, k0, k1, *cpu_params) -> the blocks' elements
    per_block: int  # elements one Philox block gives
    dtype: type  # of the result: np.float32, np.bool_ or np.int32
    cpu_params: tuple
    words: tuple  # the int64 words the kernel reads after the key's two


def _run(spec, key, shape, device):
    if device is not None and device.type == "cuda":
        from sexpgpu.numerics import cuda

        return cuda.draw(spec, shape, device, key)
    out = cpu.draw(spec.blocks, spec.per_block, math.prod(shape),
                   np.uint32 if spec.dtype is np.float32 else spec.dtype, key, *spec.cpu_params)
    if spec.dtype is np.float32:
        out = out.view(np.float32)
    out = out.reshape(shape)
    return out if device is None else arrays.torch_module().from_numpy(out)


def _drawn(name, key, shape, device, params):
    """The public draw `name`: its arguments checked in the order written, then drawn."""
    what = f"sexpgpu.numerics.{name}"
    words, shape = _key(key, what), _shape(shape, what)
    return _run(draw_spec(name, **params), words, shape, arrays.resolve_device(device, what))


def _float32_inside(low, high):
    """The smallest float32 >= low and the largest float32 < high, as bits."""
    lo = np.float32(low)
    if float(lo) < low:
        lo = np.nextafter(lo, np.float32(np.inf))
    hi = np.float32(high)
    if float(hi) >= high:
        hi = np.nextafter(hi, np.float32(-np.inf))
    return _f32_bits(lo), _f32_bits(hi)


def _uniform_spec(low=0.0, high=1.0):
    what = "sexpgpu.numerics.uniform"
    low, high = _real(low, "low", what), _real(high, "high", what)
    if not low < high:
        raise ValueError(f"{what}: low must be below high, got low={low} high={high}")
    caps = _float32_inside(low, high)
    if np.array(caps, dtype=np.uint32).view(np.float32)[0] > np.array(caps, dtype=np.uint32).view(np.float32)[1]:
        raise ValueError(f"{what}: no float32 lies in [{low}, {high})")
    return DrawSpec("uniform_kernel", draws.uniform_f32, 4, np.float32, (low, high, caps[0], caps[1]),
                    (_f64_bits(low), _f64_bits(high), caps[0], caps[1]))


def _normal_spec(mean=0.0, std=1.0):
    what = "sexpgpu.numerics.normal"
    mean, std = _real(mean, "mean", what), _real(std, "std", what)
    if std < 0:
        raise ValueError(f"{what}: std must not be negative, got {std}")
    return DrawSpec("normal_kernel", draws.normal_f32, 2, np.float32, (mean, std),
                    (_f64_bits(mean), _f64_bits(std)))


def _truncated_normal_spec(mean=0.0, std=1.0, bound=2.0):
    what = "sexpgpu.numerics.truncated_normal"
    mean, std = _real(mean, "mean", what), _real(std, "std", what)
    bound = _real(bound, "bound", what)
    if std < 0:
        raise ValueError(f"{what}: std must not be negative, got {std}")
    if bound < MIN_BOUND:
        raise ValueError(f"{what}: bound must be at least {MIN_BOUND} standard deviations, "
                         f"got {bound}")

    def blocks(b_lo, b_hi, k0, k1):
        return draws.scaled_f32(cpu.truncated_normal_pairs(b_lo, b_hi, k0, k1, bound), mean, std)

    return DrawSpec("truncated_normal_kernel", blocks, 2, np.float32, (),
                    (_f64_bits(mean), _f64_bits(std), _f64_bits(bound)))


def _bernoulli_spec(p):
    what = "sexpgpu.numerics.bernoulli"
    p = _real(p, "p", what)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{what}: p must lie in [0, 1], got {p}")
    threshold = round(p * 2**32)
    return DrawSpec("bernoulli_kernel", draws.bernoulli, 4, np.bool_, (threshold,), (threshold,))


def _randint_spec(low, high):
    what = "sexpgpu.numerics.randint"
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{what}: {name} must be an int, got {v!r}")
    low, high = int(low), int(high)
    if not INT32_MIN <= low < high <= INT32_LIMIT:
        raise ValueError(f"{what}: need -2^31 <= low < high <= 2^31, got low={low} high={high}")
    return DrawSpec("randint_kernel", draws.randint_i32, 2, np.int32, (low, high - low), (low, high - low))


SPECS = {"uniform": _uniform_spec, "normal": _normal_spec, "truncated_normal": _truncated_normal_spec,
         "bernoulli": _bernoulli_spec, "randint": _randint_spec}
# each draw's parameters by name, in order: what a caller holding them by name passes
PARAMETERS = {name: tuple(inspect.signature(spec).parameters) for name, spec in SPECS.items()}


def draw_spec(name, **params):
    """The draw `name` ("uniform", "normal", "truncated_normal", "bernoulli", "randint") with
    its parameters checked as the function of that name checks them (for draw_into)."""
    if name not in SPECS:
        close = difflib.get_close_matches(str(name), SPECS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"sexpgpu.numerics: unknown draw {name!r}{hint} (known: {', '.join(SPECS)})")
    return SPECS[name](**params)


def draw(name, key, shape, device=None, **params):
    """The draw `name` with its parameters by name: draw("normal", key, shape, std=2.0) is
    normal(key, shape, std=2.0)."""
    return _drawn(name, key, shape, device, params)


def uniform(key, shape, low=0.0, high=1.0, device=None):
    """float32 in [low, high): low + (high - low) u rounded, u = (w >> 8) 2^-24 for the
    element's word w (word i mod 4 of block i div 4).

    With the defaults the result is u itself, a multiple of 2^-24 below 1; a value that
    rounds outside [low, high) becomes the nearest float32 inside it.
    """
    return _drawn("uniform", key, shape, device, {"low": low, "high": high})


def normal(key, shape, mean=0.0, std=1.0, device=None):
    """float32 mean + std z, z a Box-Muller standard normal in float64, rounded once;
    elements 2b and 2b + 1 are the cosine and sine normals of block b."""
    return _drawn("normal", key, shape, device, {"mean": mean, "std": std})


def truncated_normal(key, shape, mean=0.0, std=1.0, bound=2.0, device=None):
    """Like normal, but each element redraws (attempt 1, 2, ...) until |z| <= bound.

    bound is in standard deviations and must be at least 0.1 (each element takes about
    1 / P(|z| <= bound) attempts).
    """
    return _drawn("truncated_normal", key, shape, device, {"mean": mean, "std": std, "bound": bound})


def bernoulli(key, shape, p, device=None):
    """bool, True where the element's word (i mod 4 of block i div 4) is below
    round(p 2^32): True with probability round(p 2^32) / 2^32."""
    return _drawn("bernoulli", key, shape, device, {"p": p})


def randint(key, shape, low, high, device=None):
    """int32 in [low, high): low + floor(u (high - low)), u = (w0 2^32 + w1) 2^-64 for even
    elements and (w2 2^32 + w3) 2^-64 for odd ones, of block i div 2.

    Each value's probability is within 2^-32 relative of 1 / (high - low).
    """
    return _drawn("randint", key, shape, device, {"low": low, "high": high})
