"""The interpreter's kernels: a numpy rule per op, `KERNELS[op](node, args, math) -> array`.

Every op but `input` and the composite ops (which the interpreter can run decomposed) needs a
kernel; a composite op's kernel is an override, one pass instead of its decomposition's ops,
checked against it by tests/backends/test_decompositions.py. See compile_kernel for COMPILED.

Float arithmetic is numpy's IEEE + - * / and sqrt, each correctly rounded in the array's
dtype; transcendental functions come from `math` (sexpgpu.numerics in the interpreter's
normal float32 mode); sums and products come from folds.py in its documented orders. A
kernel returns the node's value before bf16 rounding, which the interpreter applies to
every node of dtype bf16.
"""

from __future__ import annotations

import numpy as np

from sexpgpu.backends.cpu import folds
from sexpgpu.backends.cpu.arith import round_bf16
from sexpgpu.backends.cpu.windows import WINDOW_KERNELS
from sexpgpu.backends.cpu.draws import draw
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.core.rules import RuleTable

KERNELS = RuleTable("cpu kernels", needs=lambda op: op.name != "input" and op.decompose is None and op.kind != "exact")
COMPILED = RuleTable("cpu compiled kernels", needs=lambda op: False)  # optional: KERNELS covers every op


def _const(node, args, m):
    dtype = m.numpy_dtype(node.dtype)
    return np.full(node.shape, node.attrs["value"], dtype=dtype)


def _causal_mask(node, args, m):
    size = node.attrs["size"]
    return np.tril(np.ones((size, size), dtype=bool))


def _draw(node, args, m):
    value = draw(node, args)
    return value.astype(m.numpy_dtype(node.dtype), copy=False)


# --- unary -----------------------------------------------------------------------------------


def _relu(node, args, m):
    (x,) = args
    return np.where(x < 0, x.dtype.type(0), x)


def _gelu(node, args, m):
    # (x * 0.5) * (1 + erf(x * (1/sqrt 2))), each step rounded
    (x,) = args
    one, half, root_half = (x.dtype.type(value) for value in (1.0, 0.5, 0.7071067811865476))
    return (x * half) * (one + m.erf(x * root_half))


def _cast(node, args, m):
    (x,) = args
    target = node.dtype
    if target in ("f32", "bf16"):
        return x.astype(m.numpy_dtype(target))
    if target == "bool":
        return x != 0
    if x.dtype == np.int32:
        return x.copy()
    if x.dtype == bool:
        return x.astype(np.int32)
    # float -> i32: toward zero, NaN to 0, saturating at the i32 range (C leaves these to the machine)
    truncated = np.trunc(np.nan_to_num(x, nan=0.0))
    return np.clip(truncated, -(2.0**31), 2.0**31 - 128).astype(np.int32)


def _elementwise(name: str):
    def kernel(node, args, m):
        return getattr(m, name)(args[0])

    return kernel


# --- binary ------------------------------------------------------------------------------------


def _pow(node, args, m):
    x, y = np.broadcast_arrays(*args)
    return m.pow(np.ascontiguousarray(x), np.ascontiguousarray(y))


_NUMPY_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}


# --- reduce and normalize -------------------------------------------------------------------------


def _max(node, args, m):
    return folds.reduce_max(args[0], node.attrs["axes"], node.attrs["keep"])


def _argmax(node, args, m):
    return np.argmax(args[0], axis=node.attrs["axis"]).astype(np.int32)  # the first of equal maxima


def _exp_of_shifted(x, m):
    """m.exp(x) for scores less their maximum. A causal mask leaves many -inf among them;
    their exp is one value, computed once, and only the others go through m.exp."""
    masked = x == -np.inf
    if np.count_nonzero(masked) * 4 < x.size:
        return m.exp(x)
    out = np.empty_like(x)
    out[...] = m.exp(np.full((1,), -np.inf, x.dtype))[0]
    kept = ~masked
    out[kept] = m.exp(x[kept])
    return out


def _softmax(node, args, m):
    x, axis = args[0], node.attrs["axis"]
    if m.softmax_rows is None or axis != x.ndim - 1:
        return _softmax_along(x, axis, m)
    # one compiled pass per row, remembered: a cross-entropy's gradient is the softmax of
    # logits whose cross-entropy (the forward) has already computed it
    return m.remembered("softmax", (x,), lambda: m.softmax_rows(x, False).probabilities)


def _softmax_along(x, axis: int, m):
    exps = _exp_of_shifted(x - folds.reduce_max(x, (axis,), keep=True), m)
    return exps / folds.reduce_sum(exps, (axis,), keep=True)


def _log_softmax_over(x, axis, m):
    shifted = x - folds.reduce_max(x, (axis,), keep=True)
    return shifted - m.log(folds.reduce_sum(_exp_of_shifted(shifted, m), (axis,), keep=True))


def _log_softmax(node, args, m):
    return _log_softmax_over(args[0], node.attrs["axis"], m)


def _layernorm(node, args, m):
    # mean = fold(x) / D; c = x - mean; var = fold(c * c) / D; y = c * rsqrt(var + eps)
    (x,) = args
    axis = x.ndim - 1
    count = x.dtype.type(x.shape[-1])
    centered = x - folds.reduce_sum(x, (axis,), keep=True) / count
    var = folds.reduce_sum(centered * centered, (axis,), keep=True) / count
    return centered * m.rsqrt(var + x.dtype.type(node.attrs["eps"]))


def _cross_entropy(node, args, m):
    logits, labels = args
    check_ids(labels, logits.shape[-1], "cross-entropy label", node)
    index = labels[..., None].astype(np.intp)
    if m.softmax_rows is None:
        return -np.take_along_axis(_log_softmax_over(logits, logits.ndim - 1, m), index, -1)[..., 0]
    # the log-softmax's steps at the labels only, from the maxima and sums of one compiled
    # pass, whose probabilities the memo keeps for the gradient's softmax
    found = m.softmax_rows(logits, False)
    m.remembered("softmax", (logits,), lambda: found.probabilities)
    picked = np.take_along_axis(logits, index, -1)[..., 0]
    return -((picked - found.maxima) - m.log(found.sums))


# --- attention ---------------------------------------------------------------------------------
# attention_core is the composition the `attention` layer was built from, step for step, so
# its bits are those of the nodes it replaces: scores = q @ k^T (a product: for a bf16 node
# its float32 sum is rounded to bf16, as a bf16 matmul node rounds), scores * scale, the
# causal mask's -inf, softmax along the keys, and probabilities @ v (for a bf16 node the
# probabilities are rounded to bf16 first, as the cast before a bf16 product rounds them).
# The cotangent ops recompute the probabilities the same way and follow ops.py's formula:
# dP = g @ v^T, D = rowsum(g * o) (a fold over the output's width), dS = P * (dP - D), all in
# float32; a bf16 node rounds dS and P where they enter a product (dS @ k, dS^T @ q, P^T @ g),
# and the scale multiplies the folded products of dS. The memo hands the forward's
# probabilities to both cotangent ops, and the first one's dS to the second.


def _rounds(node, m) -> bool:
    return m.rounds_bf16 and node.dtype == "bf16"


def _as_operand(x, node, m):
    """x as a product of a bf16 node reads it: rounded to bf16."""
    return round_bf16(x) if _rounds(node, m) else x


def _swap(x):
    return np.swapaxes(x, -1, -2)


def _attention_probabilities(node, q, k, m):
    """softmax(mask(scale * (q k^T))); remembered by q's and k's bits, for the backward kernels."""
    name = f"attention_probabilities {node.attrs['scale']!r} {node.attrs['causal']} {_rounds(node, m)}"
    return m.remembered(name, (q, k), lambda: _probabilities_of(node, q, k, m))


def _probabilities_of(node, q, k, m):
    scores = _as_operand(folds.matmul(q, _swap(k)), node, m)
    scores = scores * scores.dtype.type(node.attrs["scale"])
    if m.softmax_rows is not None:  # one compiled pass per row: the same bits as the steps below
        return m.softmax_rows(scores, node.attrs["causal"]).probabilities
    if node.attrs["causal"]:
        size = scores.shape[-1]
        scores = np.where(np.tril(np.ones((size, size), dtype=bool)), scores, scores.dtype.type(-np.inf))
    return _softmax_along(scores, scores.ndim - 1, m)


def _attention_core(node, args, m):
    q, k, v = args
    return folds.matmul(_as_operand(_attention_probabilities(node, q, k, m), node, m), v)


def _attention_score_cotangent(node, args, m):
    """(P, dS) of the formula above; dS remembered by the bits of q, k, v, o and g, for the
    other backward kernel."""
    q, k, v, o, g = args
    probabilities = _attention_probabilities(node, q, k, m)

    def score_grad():
        delta = folds.reduce_sum(g * o, (g.ndim - 1,), keep=True)
        return probabilities * (folds.matmul(g, _swap(v)) - delta)

    name = f"attention_score_grad {node.attrs['scale']!r} {node.attrs['causal']} {_rounds(node, m)}"
    return probabilities, m.remembered(name, tuple(args), score_grad)


def _attention_grad_q(node, args, m):
    _, score_grad = _attention_score_cotangent(node, args, m)
    scale = score_grad.dtype.type(node.attrs["scale"])
    return folds.matmul(_as_operand(score_grad, node, m), args[1]) * scale


def _attention_grad_kv(node, args, m):
    probabilities, score_grad = _attention_score_cotangent(node, args, m)
    q, g = args[0], args[4]
    scale = score_grad.dtype.type(node.attrs["scale"])
    grad_k = folds.matmul(_swap(_as_operand(score_grad, node, m)), q) * scale
    grad_v = folds.matmul(_swap(_as_operand(probabilities, node, m)), g)
    return np.concatenate([grad_k, grad_v], axis=-1)


# --- index ------------------------------------------------------------------------------------------


def check_ids(ids, bound: int, what: str, node) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= bound):
        bad = int(ids[(ids < 0) | (ids >= bound)].flat[0])
        raise SexpgpuError("E-INDEX-001", f"{what} {bad} is outside 0..{bound - 1}.", node.loc)


def _gather(node, args, m):
    table, ids = args
    check_ids(ids, table.shape[0], "embedding id", node)
    return table[ids.astype(np.intp)]


def _scatter_add(node, args, m):
    # each result row is the fold, from +0, of the value rows whose id names it, in C order of ids
    ids, values = args
    rows = node.attrs["rows"]
    check_ids(ids, rows, "embedding id", node)
    row_shape = values.shape[ids.ndim :]
    out = np.zeros((rows,) + row_shape, values.dtype)
    width = out[0].size
    if width:
        folds.add_rows_at(ids.reshape(-1), np.ascontiguousarray(values).reshape(-1, width), out.reshape(rows, width))
    return out


def _one_hot(node, args, m):
    (ids,) = args
    depth = node.attrs["depth"]
    return (ids[..., None] == np.arange(depth, dtype=np.int32)).astype(m.numpy_dtype(node.dtype))


# --- movement -----------------------------------------------------------------------------------------


def _pad(node, args, m):
    (x,) = args
    widths = [(0, 0)] * x.ndim
    widths[node.attrs["axis"]] = (node.attrs["before"], node.attrs["after"])
    return np.pad(x, widths)


KERNELS.update({
    "const": _const,
    "causal_mask": _causal_mask,
    "normal": _draw, "uniform": _draw, "truncated_normal": _draw, "bernoulli": _draw, "randint": _draw,
    "relu": _relu,
    "gelu": _gelu,
    **{name: _elementwise(name) for name in ("tanh", "exp", "log", "rsqrt", "sigmoid", "erf")},  # numerics' functions
    "sqrt": lambda node, args, m: np.sqrt(args[0]),
    "cast": _cast,
    "pow": _pow,
    "maximum": lambda node, args, m: folds.ieee_maximum(*args),
    "minimum": lambda node, args, m: folds.ieee_minimum(*args),
    "where": lambda node, args, m: np.where(*args),
    "max": _max,
    "argmax": _argmax,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "layernorm": _layernorm,
    "cross_entropy": _cross_entropy,
    "gather": _gather,
    "scatter_add": _scatter_add,
    "one_hot": _one_hot,
    "pad": _pad,
    "attention_core": _attention_core,
    "attention_grad_q": _attention_grad_q,
    "attention_grad_kv": _attention_grad_kv,
})
KERNELS.update(WINDOW_KERNELS)  # convolution and pooling: windows.py


# --- compiled kernels -------------------------------------------------------------------------
# The interpreter runs each node through `compile_kernel(node, m)`: the node's kernel with its
# attributes looked up once, not on every run. The ops of COMPILED (the cheap ones, run most
# often) are written only in that form; their KERNELS rule compiles and runs it.


def compile_kernel(node, m):
    """`run(args) -> value` for one node."""
    compiler = COMPILED.get(node.op)
    if compiler is not None:
        return compiler(node, m)
    kernel = KERNELS[node.op]
    return lambda args: kernel(node, args, m)


def _compiled_const(node, m):
    value = _const(node, (), m)
    value.flags.writeable = False  # made once and shared by every run: no kernel writes its inputs
    return lambda args: value


def _compiled_slice(node, m):
    index = [slice(None)] * len(node.shape)
    index[node.attrs["axis"]] = slice(node.attrs["start"], node.attrs["stop"])
    index = tuple(index)
    return lambda args: args[0][index]


def _compiled_binary(node, m):
    function = _NUMPY_BINARY[node.op]
    return lambda args: function(args[0], args[1])


def _compiled_sum(node, m):
    axes, keep = tuple(node.attrs["axes"]), node.attrs["keep"]
    return lambda args: folds.reduce_sum(args[0], axes, keep)


def _with_attr(name: str, apply):
    def compiler(node, m):
        value = node.attrs[name]
        return lambda args: apply(args, value)

    return compiler


def _with_shape(apply):
    def compiler(node, m):
        shape = tuple(node.shape)
        return lambda args: apply(args[0], shape)

    return compiler


COMPILED.update({
    "const": _compiled_const,
    "slice": _compiled_slice,
    "sum": _compiled_sum,
    "reshape": _with_shape(lambda x, shape: x.reshape(shape)),
    "broadcast": _with_shape(np.broadcast_to),
    "transpose": _with_attr("perm", lambda args, perm: args[0].transpose(perm)),
    "concat": _with_attr("axis", lambda args, axis: np.concatenate(args, axis=axis)),
    "matmul": lambda node, m: lambda args: folds.matmul(args[0], args[1]),
    "neg": lambda node, m: lambda args: -args[0],
    "square": lambda node, m: lambda args: args[0] * args[0],
})
COMPILED.update({name: _compiled_binary for name in _NUMPY_BINARY})
KERNELS.update({op: lambda node, args, m: COMPILED[node.op](node, m)(args) for op in COMPILED if op not in KERNELS})
