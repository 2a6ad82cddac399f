"""Parameter initializers built on the draws, with the fan rules of docs/language.md."""

import difflib
import math

import numpy as np

from sexpgpu.numerics import arrays, sampling

PARAMETERS = {
    "zeros": {},
    "ones": {},
    "normal": {"mean": 0.0, "std": 1.0},
    "uniform": {"low": 0.0, "high": 1.0},
    "truncated-normal": {"mean": 0.0, "std": 1.0, "bound": 2.0},
    "glorot-uniform": {},
    "glorot-normal": {},
    "he-uniform": {},
    "he-normal": {},
    "small-init": {},
}


def fans(shape):
    """(fan_in, fan_out): for (OUT, IN, *rest) IN and OUT times the product of rest.

    A vector (N,) has fan_in = fan_out = N; a scalar has 1 and 1.
    """
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _constant(value, shape, device):
    if device is None:
        return np.full(shape, value, dtype=np.float32)
    torch = arrays.torch_module()
    return torch.full(shape, value, dtype=torch.float32, device=device)


def _draw(name, key, shape, device, params):
    fan_in, fan_out = fans(shape)
    if name == "normal":
        return sampling.normal(key, shape, params["mean"], params["std"], device)
    if name == "uniform":
        return sampling.uniform(key, shape, params["low"], params["high"], device)
    if name == "truncated-normal":
        return sampling.truncated_normal(key, shape, params["mean"], params["std"],
                                         params["bound"], device)
    if name == "glorot-uniform":
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return sampling.uniform(key, shape, -limit, limit, device)
    if name == "glorot-normal":
        return sampling.normal(key, shape, 0.0, math.sqrt(2.0 / (fan_in + fan_out)), device)
    if name == "he-uniform":
        limit = math.sqrt(6.0 / fan_in)
        return sampling.uniform(key, shape, -limit, limit, device)
    if name == "he-normal":
        return sampling.normal(key, shape, 0.0, math.sqrt(2.0 / fan_in), device)
    if len(shape) == 0:
        raise ValueError("small-init needs a shape with at least one axis")
    return sampling.normal(key, shape, 0.0, math.sqrt(2.0 / (5 * shape[-1])), device)


def initialize(name, key, shape, device=None, **params):
    """A float32 parameter of `shape` drawn by the initializer `name` from `key`.

    Initializers and their parameters (defaults) are those of PARAMETERS; the scaled ones
    use fans(shape): glorot-uniform U(-a, a), a = sqrt(6 / (fan_in + fan_out));
    glorot-normal N(0, 2 / (fan_in + fan_out)); he-uniform U(-a, a), a = sqrt(6 / fan_in);
    he-normal N(0, 2 / fan_in); small-init N(0, 2 / (5 d)), d the last axis.
    """
    what = "sexpgpu.numerics.initialize"
    if name not in PARAMETERS:
        close = difflib.get_close_matches(str(name), PARAMETERS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{what}: unknown initializer {name!r}{hint} "
                         f"(known: {', '.join(PARAMETERS)})")
    unknown = sorted(set(params) - set(PARAMETERS[name]))
    if unknown:
        accepted = ", ".join(PARAMETERS[name]) or "none"
        raise TypeError(f"{what}: {name} takes no parameter {', '.join(unknown)} "
                        f"(accepted: {accepted})")
    shape = sampling._shape(shape, what)
    device = arrays.resolve_device(device, what)
    if name in ("zeros", "ones"):
        return _constant(0.0 if name == "zeros" else 1.0, shape, device)
    if math.prod(shape) == 0:
        return _constant(0.0, shape, device)
    return _draw(name, key, shape, device, {**PARAMETERS[name], **params})
