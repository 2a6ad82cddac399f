"""The update graph: the summed microbatch gradients in, new parameters and optimizer state out.

Inputs, in this order: `param/<path>` (path order), `grad/<path>` (float32: the left fold of
the microbatch gradients, microbatch 0 first), `state/<slot>/<path>` (slots in the order of
`STATE_SLOTS`, then path order; float32, zeros before the first update), `step` (i32: the
1-based count of updates, this one included; Adam's bias correction reads it) and `lr`
(f32: the schedule's rate for this step).
Outputs: `param/<path>`, `state/<slot>/<path>`, and `grad_norm`.

The optimizer works on one flat float32 vector per quantity, the *flat layout*: every
parameter's elements in path order, C order within each (a bf16 parameter read as float32).
The update is elementwise, so this changes no bits of it; it makes one fold of the norm and
a few long vector operations instead of a handful per parameter. Each new parameter is its
slice of the flat result, rounded back to bf16 where the parameter is bf16. All arithmetic
is float32, in the order written:

    g      = grad / M                          (M = :microbatches; skipped when M is 1)
    norm   = sqrt(fold of g * g)               one left fold over the flat layout
    g      = g * min(clip / (norm + 1e-6), 1)  (only with a finite :clip, as torch clips)
    g      = g + wd * p                        (sgd, momentum, adam with :weight-decay: L2)
    sgd:       p = p - lr * g
    momentum:  b = mu * b + g;  d = g + mu * b (nesterov) or b;  p = p - lr * d
    adam(w):   p = p * (1 - lr * wd)           (adamw: decoupled decay first)
               m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * (g * g)
               c1 = 1 - b1^t;  c2 = 1 - b2^t   (t = step as f32, ^ = portable pow)
               p = p - lr * ((m / c1) / (sqrt(v / c2) + eps))
`grad_norm` is `norm`, the norm before clipping. Constants such as 1 - b1 are formed in
float64 and rounded once to float32.
"""

from __future__ import annotations

import math

from sexpgpu.graph.core.emit import Emitter

STATE_SLOTS = {"sgd": (), "momentum": ("momentum",), "adam": ("m", "v"), "adamw": ("m", "v")}
CLIP_EPSILON = 1e-6


def build_update(params: dict, optimizer, microbatches: int):
    """(update graph, {slot: [paths]}) for `params` {path: ParamSpec}."""
    e = Emitter()
    e.loc = optimizer.loc  # a limit the update passes (its flat vector of every parameter) is the optimizer's
    paths = sorted(params)
    slots = STATE_SLOTS[optimizer.kind]
    inputs = {}
    for path in paths:
        inputs[f"param/{path}"] = e.input(f"param/{path}", params[path].dtype, params[path].shape)
    for path in paths:
        inputs[f"grad/{path}"] = e.input(f"grad/{path}", "f32", params[path].shape)
    for slot in slots:
        for path in paths:
            inputs[f"state/{slot}/{path}"] = e.input(f"state/{slot}/{path}", "f32", params[path].shape)
    step = inputs["step"] = e.input("step", "i32", ())
    lr = inputs["lr"] = e.input("lr", "f32", ())
    if not paths:
        return e.graph(inputs, {"grad_norm": _f32(e, 0.0)}), {slot: [] for slot in slots}

    grad = _mean_gradient(e, _flat(e, [inputs[f"grad/{path}"] for path in paths]), microbatches)
    norm = e("sqrt", e("sum", e("square", grad), axes=None, keep=False))
    grad = _clipped(e, grad, norm, optimizer.clip)
    value = _flat(e, [inputs[f"param/{path}"] for path in paths])
    state = {slot: _flat(e, [inputs[f"state/{slot}/{path}"] for path in paths]) for slot in slots}
    corrections = _bias_corrections(e, optimizer, step) if slots == ("m", "v") else None
    new_value, new_state = _step(e, optimizer, value, grad, state, lr, corrections)

    outputs = {f"param/{path}": part for path, part in zip(paths, _unflat(e, new_value, params, paths))}
    for slot in slots:
        parts = _unflat(e, new_state[slot], params, paths, keep_f32=True)
        outputs.update({f"state/{slot}/{path}": part for path, part in zip(paths, parts)})
    outputs["grad_norm"] = norm
    return e.graph(inputs, outputs), {slot: list(paths) for slot in slots}


def _flat(e, nodes: list):
    """The flat layout of `nodes` as one float32 vector."""
    parts = [e("reshape", node if node.dtype == "f32" else e("cast", node, dtype="f32"), shape=(node.size,))
             for node in nodes]
    return parts[0] if len(parts) == 1 else e("concat", *parts, axis=0)


def _unflat(e, flat, params: dict, paths: list, keep_f32: bool = False) -> list:
    parts, start = [], 0
    for path in paths:
        spec = params[path]
        size = math.prod(spec.shape)
        part = flat if len(paths) == 1 else e("slice", flat, axis=0, start=start, stop=start + size)
        part = e("reshape", part, shape=tuple(spec.shape))
        if spec.dtype != "f32" and not keep_f32:
            part = e("cast", part, dtype=spec.dtype)
        parts.append(part)
        start += size
    return parts


def _f32(e, value: float):
    return e.const(value, dtype="f32")


def _mean_gradient(e, grad, microbatches: int):
    return grad if microbatches == 1 else e("div", grad, _f32(e, microbatches))


def _clipped(e, grad, norm, clip: float):
    if math.isinf(clip):
        return grad
    coefficient = e("minimum", e("div", _f32(e, clip), e("add", norm, _f32(e, CLIP_EPSILON))), _f32(e, 1.0))
    return e("mul", grad, coefficient)


def _bias_corrections(e, optimizer, step):
    """(1 - b1^t, 1 - b2^t): one pow of the vector (b1, b2), since each pow call costs."""
    t = e("cast", step, dtype="f32")
    betas = e("concat", *(e("reshape", _f32(e, beta), shape=(1,)) for beta in (optimizer.beta1, optimizer.beta2)), axis=0)
    corrections = e("sub", _f32(e, 1.0), e("pow", betas, t))
    return tuple(e("reshape", e("slice", corrections, axis=0, start=i, stop=i + 1), shape=()) for i in (0, 1))


def _step(e, optimizer, p, g, state: dict, lr, corrections):
    kind, decay = optimizer.kind, optimizer.weight_decay
    if decay and kind != "adamw":
        g = e("add", g, e("mul", _f32(e, decay), p))
    if kind == "sgd":
        return e("sub", p, e("mul", lr, g)), {}
    if kind == "momentum":
        mu = _f32(e, optimizer.momentum)
        buffer = e("add", e("mul", mu, state["momentum"]), g)
        direction = e("add", g, e("mul", mu, buffer)) if optimizer.nesterov else buffer
        return e("sub", p, e("mul", lr, direction)), {"momentum": buffer}
    if kind == "adamw" and decay:
        p = e("mul", p, e("sub", _f32(e, 1.0), e("mul", lr, _f32(e, decay))))
    m = e("add", e("mul", _f32(e, optimizer.beta1), state["m"]), e("mul", _f32(e, 1.0 - optimizer.beta1), g))
    v = e("add", e("mul", _f32(e, optimizer.beta2), state["v"]), e("mul", _f32(e, 1.0 - optimizer.beta2), e("square", g)))
    first, second = corrections
    denominator = e("add", e("sqrt", e("div", v, second)), _f32(e, optimizer.eps))
    return e("sub", p, e("mul", lr, e("div", e("div", m, first), denominator))), {"m": m, "v": v}
