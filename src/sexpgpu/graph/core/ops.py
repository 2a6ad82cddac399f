"""The one op table: every op defined once, as an `OpDef`.

An `OpDef` carries everything about an op that is not a backend's:
- `infer(inputs, attrs) -> (dtype, shape, attrs)` checks the inputs, puts the attributes in
  canonical form (axes made non-negative, sorted where order does not matter) and gives the
  result's dtype and shape;
- `vjp(e, node, g) -> (grad or None, ...)` gives one cotangent per input for the cotangent `g`
  of the node's result, built from other ops through the emitter `e` (see emit.py); an op
  without one has no gradient: its result is an integer, a mask, or a draw;
- `precision`: its `Policy` under `:precision bf16` (graph/passes/precision.py applies it);
- `decompose(e, attrs, *inputs) -> node`, for a composite op: its formula written with other
  ops (graph/passes/decomposed.py applies it). A backend's kernel for such an op is an
  override, checked against the decomposition (tests/backends/test_decompositions.py);
- `mixes_rows(node, stacked) -> bool`, for an op that can combine rows of its inputs' first
  axis into a row of its result (along axis 0, a gather from a stacked table): whether this
  node does, `stacked[i]` saying whether input i holds records on its first axis. None: the
  result's row i comes from the inputs' rows i, or its shape does not scale with theirs
  (graph/training/stacking.py checks both).

What a backend does with an op is a rule registered against it (rules.py). `define` adds an
op and `undefine` takes it back (tests add ops of their own).

Ops are grouped by kind, in the order of this file:
- source: input, const, causal_mask
- draw: normal, uniform, truncated_normal, bernoulli, randint
- unary (elementwise): neg relu gelu tanh exp log sqrt rsqrt sigmoid square erf, cast
- binary (elementwise, numpy broadcasting): add sub mul div pow maximum minimum
- compare (elementwise, to bool): eq ne lt le gt ge; select: where
- reduce: sum max (over a tuple of axes), argmax (over one axis)
- normalize (over one axis): softmax log_softmax, layernorm (last axis, no gain or bias)
- loss: cross_entropy (per position, integer labels)
- index: gather (rows of a table), scatter_add (its transpose), one_hot
- movement: reshape transpose slice pad concat broadcast
- contract: matmul (batched, leading dims broadcast)
- attention: attention_core (scaled dot-product attention over (..., T, E)) and its two
  cotangent ops attention_grad_q, attention_grad_kv
- window (NCHW images): conv2d and its two cotangents conv2d_input_grad conv2d_weight_grad,
  max_pool2d max_pool2d_grad max_pool2d_pick, avg_pool2d avg_pool2d_grad

Derived operations of the language (mean, mse, linear, dropout, ...) are compositions
(the `attention` layer around its attention_core) built by graph/frontend; their gradients come from these rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from sexpgpu.graph.core.ir import DTYPES, FLOAT_DTYPES


class OpError(Exception):
    """A shape, dtype or attribute rule broken; the builder adds the location."""

    def __init__(self, code: str, message: str):
        self.code = code
        self.message = message
        super().__init__(message)


@dataclass(frozen=True)
class Policy:  # an op under `:precision bf16` (graph/passes/precision.py says what each kind does)
    kind: str  # "product" or "float32"
    why: str  # the reason, as docs/language.md gives it


PRODUCT = Policy("product", "bf16 operands, float32 sums, the result rounded to bf16 and widened")
ATTENTION = Policy("product", "bf16 q, k, v; float32 softmax statistics and sums; the output rounded to bf16 and "
                              "widened")
STATISTIC = Policy("float32", "a normalisation, its statistics or the loss: float32")
ARITHMETIC = Policy("float32", "elementwise arithmetic: computed and stored in float32")
MOVES = Policy("float32", "moves, picks or makes values: keeps its input's dtype (float32)")

# an op's policy when its definition gives none
KIND_PRECISION = {
    "source": MOVES, "draw": MOVES, "unary": ARITHMETIC, "binary": ARITHMETIC, "compare": ARITHMETIC,
    "select": ARITHMETIC, "reduce": STATISTIC, "normalize": STATISTIC, "loss": STATISTIC,
    "index": MOVES, "movement": MOVES, "contract": PRODUCT, "attention": ATTENTION,
}


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    infer: Callable
    vjp: Callable | None = None
    arity: int | None = None  # None: any number of inputs (the rule checks)
    precision: Policy | None = None  # None: its kind's (KIND_PRECISION)
    decompose: Callable | None = None  # a composite op's formula in other ops
    mixes_rows: Callable | None = None  # whether a node combines rows of its inputs' first axis


OPS: dict = {}


def define(op: OpDef) -> OpDef:
    """Add `op` to OPS, with its kind's precision policy when it gives none."""
    if op.name in OPS:
        raise KeyError(f"a second op named {op.name!r}")
    OPS[op.name] = op = replace(op, precision=op.precision or KIND_PRECISION[op.kind])
    return op


def undefine(name: str) -> None:  # for tests that define ops; RuleTable.remove takes back rules
    del OPS[name]


def _register(name: str, kind: str, infer, vjp=None, arity=None, **more) -> None:
    define(OpDef(name, kind, infer, vjp, arity, **more))


def _along_first_axis(node, stacked) -> bool:
    return node.attrs.get("axis") == 0


def dims_text(shape) -> str:
    return "(" + " ".join(str(dim) for dim in shape) + ")"


# --- shared rules --------------------------------------------------------------------------


def broadcast_shapes(op: str, *shapes) -> tuple:
    rank = max(len(shape) for shape in shapes)
    result = []
    for axis in range(rank):
        dims = {shape[axis - rank + len(shape)] for shape in shapes if axis - rank + len(shape) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            listed = " and ".join(dims_text(shape) for shape in shapes)
            raise OpError("E-SHAPE-001", f"{op}: shapes {listed} do not broadcast.")
        result.append(dims.pop() if dims else 1)
    return tuple(result)


def _same_dtype(op: str, nodes) -> str:
    dtypes = [node.dtype for node in nodes]
    if any(dtype != dtypes[0] for dtype in dtypes):
        listed = " and ".join(dtypes)
        raise OpError("E-DTYPE-001", f"{op}: dtypes {listed} differ; convert one with (cast X DTYPE).")
    return dtypes[0]


def _require_dtype(op: str, node, allowed, what: str = "its input") -> None:
    if node.dtype not in allowed:
        raise OpError(
            "E-DTYPE-001", f"{op}: {what} is {node.dtype}, expected {' or '.join(allowed)}."
        )


def _axis(op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise OpError("E-GRAPH-003", f"{op}: axis {axis} is out of range for rank {rank}.")
    return axis % max(rank, 1)


def _axes(op: str, axes, rank: int) -> tuple:
    if axes is None:
        return tuple(range(rank))
    normal = sorted(_axis(op, axis, rank) for axis in axes)
    if len(set(normal)) != len(normal):
        raise OpError("E-GRAPH-003", f"{op}: axis listed twice in {tuple(axes)}.")
    return tuple(normal)


def _reduced_shape(shape, axes, keep) -> tuple:
    if keep:
        return tuple(1 if axis in axes else dim for axis, dim in enumerate(shape))
    return tuple(dim for axis, dim in enumerate(shape) if axis not in axes)


# --- shape rules of elementwise ops ---------------------------------------------------------

_NUMERIC = FLOAT_DTYPES + ("i32",)


def elementwise(op: str, allowed=FLOAT_DTYPES):
    """The shape rule of a unary elementwise op on the dtypes `allowed`."""
    def infer(inputs, attrs):
        _require_dtype(op, inputs[0], allowed)
        return inputs[0].dtype, inputs[0].shape, attrs

    return infer


def _binary(op: str, allowed):
    def infer(inputs, attrs):
        dtype = _same_dtype(op, inputs)
        _require_dtype(op, inputs[0], allowed, "the dtype of its inputs")
        return dtype, broadcast_shapes(op, inputs[0].shape, inputs[1].shape), attrs

    return infer


# --- source ----------------------------------------------------------------------------------


def _infer_input(inputs, attrs):
    if attrs.get("dtype") not in DTYPES:
        raise OpError("E-DTYPE-001", f"input {attrs.get('name')}: unknown dtype {attrs.get('dtype')}.")
    return attrs["dtype"], tuple(attrs["shape"]), attrs


def _infer_const(inputs, attrs):
    dtype = attrs["dtype"]
    if dtype not in DTYPES:
        raise OpError("E-DTYPE-001", f"const: unknown dtype {dtype}.")
    value = attrs["value"]
    if dtype == "i32" and (not float(value).is_integer() or not -(2**31) <= value < 2**31):
        raise OpError("E-DTYPE-001", f"the constant {value} is not an i32 value.")
    return dtype, tuple(attrs["shape"]), attrs


def _infer_causal_mask(inputs, attrs):
    size = attrs["size"]
    return "bool", (size, size), attrs


_register("input", "source", _infer_input, arity=0)
_register("const", "source", _infer_const, arity=0)
_register("causal_mask", "source", _infer_causal_mask, arity=0)


# --- draws -----------------------------------------------------------------------------------
# attrs: shape, seed, stream (the stream key's path), salts (a tuple naming each input:
# "step", "microbatch" or "field:NAME"), the distribution's parameters, and for a stacked
# draw `repeats`: the draw of shape (shape[0] / repeats, ...) repeated along the first axis. The inputs are
# the salt values, folded into the key in input order (backends/cpu/draws.py).

_DRAW_RESULT = {"normal": "f32", "uniform": "f32", "truncated_normal": "f32", "bernoulli": "bool", "randint": "i32"}


def _infer_draw(op: str):
    def infer(inputs, attrs):
        salts = attrs["salts"]
        if len(salts) != len(inputs):
            raise OpError("E-GRAPH-003", f"{op}: {len(salts)} salts named for {len(inputs)} salt inputs.")
        shape = tuple(attrs["shape"])
        repeats = attrs.get("repeats", 1)  # a stacked draw: `repeats` copies on its first axis (graph/training/stacking.py)
        if repeats != 1 and (not shape or shape[0] % repeats or any(source.rank for source in inputs)):
            raise OpError("E-SHAPE-001", f"{op}: {repeats} repeats of a draw of shape {dims_text(shape)} salted per record.")
        for kind, source in zip(salts, inputs):
            _require_dtype(op, source, ("i32",), f"its salt {kind}")
            if source.rank == 1 and (not shape or shape[0] != source.shape[0]):
                raise OpError(
                    "E-SHAPE-001",
                    f"{op}: a salt read from a record field salts each record's row, so the draw's "
                    f"first axis must be the batch: shapes {dims_text(shape)} and {dims_text(source.shape)}.",
                )
            if source.rank > 1:
                raise OpError("E-SHAPE-001", f"{op}: salt {kind} must hold one integer per record, has shape {dims_text(source.shape)}.")
        return _DRAW_RESULT[op], shape, attrs

    return infer


for _name in _DRAW_RESULT:
    _register(_name, "draw", _infer_draw(_name))


# --- unary -------------------------------------------------------------------------------------

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _vjp_neg(e, node, g):
    return (e("neg", g),)


def _vjp_relu(e, node, g):
    (x,) = node.inputs
    return (e("where", e("gt", x, e.const(0, like=x)), g, e.const(0, like=g)),)


def _vjp_gelu(e, node, g):
    # d/dx [x Phi(x)] = Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2
    (x,) = node.inputs
    cdf = e("mul", e("add", e("erf", e("mul", x, e.const(_SQRT_HALF, like=x))), e.const(1, like=x)), e.const(0.5, like=x))
    pdf = e("mul", e("exp", e("mul", e("square", x), e.const(-0.5, like=x))), e.const(_INV_SQRT_2PI, like=x))
    return (e("mul", g, e("add", cdf, e("mul", x, pdf))),)


def _vjp_tanh(e, node, g):
    return (e("mul", g, e("sub", e.const(1, like=node), e("square", node))),)


def _vjp_exp(e, node, g):
    return (e("mul", g, node),)


def _vjp_log(e, node, g):
    return (e("div", g, node.inputs[0]),)


def _vjp_sqrt(e, node, g):
    return (e("div", g, e("mul", node, e.const(2, like=node))),)


def _vjp_rsqrt(e, node, g):
    # d/dx x^(-1/2) = -y / (2x)
    (x,) = node.inputs
    return (e("mul", g, e("div", e("mul", node, e.const(-0.5, like=node)), x)),)


def _vjp_sigmoid(e, node, g):
    return (e("mul", g, e("mul", node, e("sub", e.const(1, like=node), node))),)


def _vjp_square(e, node, g):
    return (e("mul", g, e("mul", node.inputs[0], e.const(2, like=node))),)


def _vjp_erf(e, node, g):
    (x,) = node.inputs
    slope = e("mul", e("exp", e("neg", e("square", x))), e.const(_TWO_OVER_SQRT_PI, like=x))
    return (e("mul", g, slope),)


def _infer_cast(inputs, attrs):
    if attrs["dtype"] not in DTYPES:
        raise OpError("E-DTYPE-001", f"cast: unknown dtype {attrs['dtype']}; expected f32, bf16 or i32.")
    return attrs["dtype"], inputs[0].shape, attrs


def _vjp_cast(e, node, g):
    (x,) = node.inputs
    if x.dtype not in FLOAT_DTYPES or node.dtype not in FLOAT_DTYPES:
        return (None,)
    return (e("cast", g, dtype=x.dtype),)


_register("neg", "unary", elementwise("neg", _NUMERIC), _vjp_neg, 1)
_register("relu", "unary", elementwise("relu"), _vjp_relu, 1)
_register("gelu", "unary", elementwise("gelu"), _vjp_gelu, 1)
_register("tanh", "unary", elementwise("tanh"), _vjp_tanh, 1)
_register("exp", "unary", elementwise("exp"), _vjp_exp, 1)
_register("log", "unary", elementwise("log"), _vjp_log, 1)
_register("sqrt", "unary", elementwise("sqrt"), _vjp_sqrt, 1)
_register("rsqrt", "unary", elementwise("rsqrt"), _vjp_rsqrt, 1)
_register("sigmoid", "unary", elementwise("sigmoid"), _vjp_sigmoid, 1)
_register("square", "unary", elementwise("square", _NUMERIC), _vjp_square, 1)
_register("erf", "unary", elementwise("erf"), _vjp_erf, 1)
_register("cast", "unary", _infer_cast, _vjp_cast, 1)


# --- binary ------------------------------------------------------------------------------------


def _vjp_add(e, node, g):
    a, b = node.inputs
    return e.unbroadcast(g, a.shape), e.unbroadcast(g, b.shape)


def _vjp_sub(e, node, g):
    a, b = node.inputs
    return e.unbroadcast(g, a.shape), e.unbroadcast(e("neg", g), b.shape)


def _vjp_mul(e, node, g):
    a, b = node.inputs
    return e.unbroadcast(e("mul", g, b), a.shape), e.unbroadcast(e("mul", g, a), b.shape)


def _vjp_div(e, node, g):
    a, b = node.inputs
    grad_b = e("neg", e("div", e("mul", g, node), b))
    return e.unbroadcast(e("div", g, b), a.shape), e.unbroadcast(grad_b, b.shape)


def _vjp_pow(e, node, g):
    x, y = node.inputs
    grad_x = e("mul", g, e("mul", y, e("pow", x, e.minus_one(y))))
    grad_y = e("mul", g, e("mul", node, e("log", x)))
    return e.unbroadcast(grad_x, x.shape), e.unbroadcast(grad_y, y.shape)


def _vjp_select_larger(compare: str):
    # ties send the whole cotangent to the first input, as a subgradient
    def vjp(e, node, g):
        a, b = node.inputs
        first = e(compare, a, b)
        zero = e.const(0, like=g)
        return e.unbroadcast(e("where", first, g, zero), a.shape), e.unbroadcast(e("where", first, zero, g), b.shape)

    return vjp


_register("add", "binary", _binary("add", _NUMERIC), _vjp_add, 2)
_register("sub", "binary", _binary("sub", _NUMERIC), _vjp_sub, 2)
_register("mul", "binary", _binary("mul", _NUMERIC), _vjp_mul, 2)
_register("div", "binary", _binary("div", FLOAT_DTYPES), _vjp_div, 2)
_register("pow", "binary", _binary("pow", FLOAT_DTYPES), _vjp_pow, 2)
_register("maximum", "binary", _binary("maximum", _NUMERIC), _vjp_select_larger("ge"), 2)
_register("minimum", "binary", _binary("minimum", _NUMERIC), _vjp_select_larger("le"), 2)


# --- compare and select --------------------------------------------------------------------------


def _infer_compare(op: str):
    def infer(inputs, attrs):
        _same_dtype(op, inputs)
        return "bool", broadcast_shapes(op, inputs[0].shape, inputs[1].shape), attrs

    return infer


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _register(_name, "compare", _infer_compare(_name), arity=2)


def _infer_where(inputs, attrs):
    cond, a, b = inputs
    _require_dtype("where", cond, ("bool",), "its condition")
    dtype = _same_dtype("where", (a, b))
    return dtype, broadcast_shapes("where", cond.shape, a.shape, b.shape), attrs


def _vjp_where(e, node, g):
    cond, a, b = node.inputs
    zero = e.const(0, like=g)
    return None, e.unbroadcast(e("where", cond, g, zero), a.shape), e.unbroadcast(e("where", cond, zero, g), b.shape)


_register("where", "select", _infer_where, _vjp_where, 3)


# --- reduce --------------------------------------------------------------------------------------
# attrs: axes (sorted, non-negative), keep (bool). Backends fold the reduced elements in the
# C order of the reduced axes (backends/cpu/folds.py documents the interpreter's order).


def _infer_reduce(op: str, allowed):
    def infer(inputs, attrs):
        (x,) = inputs
        _require_dtype(op, x, allowed)
        axes = _axes(op, attrs.get("axes"), x.rank)
        keep = bool(attrs.get("keep", False))
        return x.dtype, _reduced_shape(x.shape, axes, keep), {"axes": axes, "keep": keep}

    return infer


def _vjp_sum(e, node, g):
    (x,) = node.inputs
    return (e.expand(g, node, x.shape),)


def _vjp_max(e, node, g):
    # ties share the cotangent equally, as torch.amax does
    (x,) = node.inputs
    axes = node.attrs["axes"]
    hit = e("cast", e("eq", x, e.expand(node, node, x.shape)), dtype=x.dtype)
    count = e("sum", hit, axes=axes, keep=True)
    share = e("div", e.expand(g, node, x.shape), e("broadcast", count, shape=x.shape))
    return (e("mul", share, hit),)


def _infer_argmax(inputs, attrs):
    (x,) = inputs
    _require_dtype("argmax", x, _NUMERIC)
    axis = _axis("argmax", attrs["axis"], x.rank)
    return "i32", _reduced_shape(x.shape, (axis,), False), {"axis": axis}


_register("sum", "reduce", _infer_reduce("sum", _NUMERIC), _vjp_sum, 1)
_register("max", "reduce", _infer_reduce("max", _NUMERIC), _vjp_max, 1)
_register("argmax", "reduce", _infer_argmax, None, 1, mixes_rows=_along_first_axis)


# --- normalize -------------------------------------------------------------------------------------


def _infer_over_axis(op: str):
    def infer(inputs, attrs):
        (x,) = inputs
        _require_dtype(op, x, FLOAT_DTYPES)
        if x.rank == 0:
            raise OpError("E-SHAPE-001", f"{op}: needs at least one axis, got a scalar.")
        return x.dtype, x.shape, {"axis": _axis(op, attrs.get("axis", -1), x.rank)}

    return infer


def _vjp_softmax(e, node, g):
    axis = node.attrs["axis"]
    inner = e("sum", e("mul", g, node), axes=(axis,), keep=True)
    return (e("mul", node, e("sub", g, inner)),)


def _vjp_log_softmax(e, node, g):
    axis = node.attrs["axis"]
    total = e("sum", g, axes=(axis,), keep=True)
    return (e("sub", g, e("mul", e("exp", node), total)),)


def _infer_layernorm(inputs, attrs):
    (x,) = inputs
    _require_dtype("layernorm", x, FLOAT_DTYPES)
    if x.rank == 0:
        raise OpError("E-SHAPE-001", "layernorm: needs at least one axis, got a scalar.")
    return x.dtype, x.shape, {"eps": float(attrs["eps"])}


def layernorm_statistics(e, x, eps: float):
    """(x - mean, 1/sqrt(var + eps)) over the last axis, as the interpreter computes them."""
    axis = x.rank - 1
    count = e.const(x.shape[-1], like=x)
    mean = e("div", e("sum", x, axes=(axis,), keep=True), count)
    centered = e("sub", x, mean)
    var = e("div", e("sum", e("square", centered), axes=(axis,), keep=True), count)
    return centered, e("rsqrt", e("add", var, e.const(eps, like=x)))


def _shifted(e, x, axis: int):
    return e("sub", x, e("max", x, axes=(axis,), keep=True))


def _decompose_softmax(e, attrs, x):
    exps = e("exp", _shifted(e, x, attrs["axis"]))
    return e("div", exps, e("sum", exps, axes=(attrs["axis"],), keep=True))


def _decompose_log_softmax(e, attrs, x):
    shifted = _shifted(e, x, attrs["axis"])
    return e("sub", shifted, e("log", e("sum", e("exp", shifted), axes=(attrs["axis"],), keep=True)))


def _decompose_layernorm(e, attrs, x):
    return e("mul", *layernorm_statistics(e, x, attrs["eps"]))


def _vjp_layernorm(e, node, g):
    # dx = r (g - mean(g) - y mean(g y)), the statistics recomputed from x
    (x,) = node.inputs
    axis = x.rank - 1
    _, rstd = layernorm_statistics(e, x, node.attrs["eps"])
    count = e.const(x.shape[-1], like=x)
    mean_g = e("div", e("sum", g, axes=(axis,), keep=True), count)
    mean_gy = e("div", e("sum", e("mul", g, node), axes=(axis,), keep=True), count)
    inner = e("sub", e("sub", g, mean_g), e("mul", node, mean_gy))
    return (e("mul", inner, rstd),)


_register("softmax", "normalize", _infer_over_axis("softmax"), _vjp_softmax, 1, decompose=_decompose_softmax,
          mixes_rows=_along_first_axis)
_register("log_softmax", "normalize", _infer_over_axis("log_softmax"), _vjp_log_softmax, 1,
          decompose=_decompose_log_softmax, mixes_rows=_along_first_axis)
_register("layernorm", "normalize", _infer_layernorm, _vjp_layernorm, 1, decompose=_decompose_layernorm,
          mixes_rows=lambda node, stacked: node.rank == 1)  # its statistics run along the last axis


# --- loss ----------------------------------------------------------------------------------------------


def _infer_cross_entropy(inputs, attrs):
    logits, labels = inputs
    _require_dtype("cross-entropy", logits, FLOAT_DTYPES, "its logits")
    _require_dtype("cross-entropy", labels, ("i32",), "its labels")
    if logits.rank == 0 or logits.shape[:-1] != labels.shape:
        raise OpError(
            "E-SHAPE-001",
            f"cross-entropy: logits {dims_text(logits.shape)} need labels of shape "
            f"{dims_text(logits.shape[:-1])}, got {dims_text(labels.shape)}.",
        )
    return logits.dtype, labels.shape, attrs


def _vjp_cross_entropy(e, node, g):
    # d/dlogits = g (softmax(logits) - one_hot(labels))
    logits, labels = node.inputs
    axis = logits.rank - 1
    probs = e("softmax", logits, axis=axis)
    target = e("one_hot", labels, depth=logits.shape[-1], dtype=logits.dtype)
    spread = e("reshape", g, shape=g.shape + (1,))
    return e("mul", spread, e("sub", probs, target)), None


def _decompose_cross_entropy(e, attrs, logits, labels):
    # -log_softmax(logits) at each label: the one term the label's row keeps, summed with zeros
    axis = logits.rank - 1
    hit = e("one_hot", labels, depth=logits.shape[-1], dtype="bool")
    picked = e("where", hit, e("log_softmax", logits, axis=axis), e.const(0, like=logits))
    return e("neg", e("sum", picked, axes=(axis,), keep=False))


_register("cross_entropy", "loss", _infer_cross_entropy, _vjp_cross_entropy, 2, decompose=_decompose_cross_entropy)


# --- index -----------------------------------------------------------------------------------------------


def _infer_gather(inputs, attrs):
    table, ids = inputs
    _require_dtype("embedding", ids, ("i32",), "its ids")
    if table.rank == 0:
        raise OpError("E-SHAPE-001", "embedding: the table needs at least one axis.")
    return table.dtype, ids.shape + table.shape[1:], attrs


def _vjp_gather(e, node, g):
    table, ids = node.inputs
    return e("scatter_add", ids, g, rows=table.shape[0]), None


def _infer_scatter_add(inputs, attrs):
    ids, values = inputs
    _require_dtype("scatter_add", ids, ("i32",), "its ids")
    if values.shape[: ids.rank] != ids.shape:
        raise OpError("E-SHAPE-001", f"scatter_add: values {dims_text(values.shape)} do not start with ids {dims_text(ids.shape)}.")
    return values.dtype, (attrs["rows"],) + values.shape[ids.rank :], attrs


def _vjp_scatter_add(e, node, g):
    ids, values = node.inputs
    return None, e("gather", g, ids)


def _infer_one_hot(inputs, attrs):
    (ids,) = inputs
    _require_dtype("one_hot", ids, ("i32",))
    return attrs["dtype"], ids.shape + (attrs["depth"],), attrs


_register("gather", "index", _infer_gather, _vjp_gather, 2,
          mixes_rows=lambda node, stacked: stacked[0])  # rows of a stacked table, picked by one microbatch's ids
_register("scatter_add", "index", _infer_scatter_add, _vjp_scatter_add, 2, mixes_rows=lambda node, stacked: True)
_register("one_hot", "index", _infer_one_hot, None, 1)


# --- movement ------------------------------------------------------------------------------------------


def _infer_reshape(inputs, attrs):
    (x,) = inputs
    shape = tuple(attrs["shape"])
    count = math.prod(shape)
    if count != x.size or any(dim < 0 for dim in shape):
        raise OpError("E-SHAPE-001", f"reshape: cannot reshape {dims_text(x.shape)} ({x.size} elements) to {dims_text(shape)}.")
    return x.dtype, shape, {"shape": shape}


def _vjp_reshape(e, node, g):
    return (e("reshape", g, shape=node.inputs[0].shape),)


def _infer_transpose(inputs, attrs):
    (x,) = inputs
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise OpError("E-SHAPE-001", f"transpose: {dims_text(perm)} is not a permutation of the axes of {dims_text(x.shape)}.")
    return x.dtype, tuple(x.shape[axis] for axis in perm), {"perm": perm}


def _vjp_transpose(e, node, g):
    perm = node.attrs["perm"]
    inverse = tuple(perm.index(axis) for axis in range(len(perm)))
    return (e("transpose", g, perm=inverse),)


def _infer_slice(inputs, attrs):
    (x,) = inputs
    axis = _axis("slice", attrs["axis"], x.rank)
    dim = x.shape[axis]
    start, stop = attrs["start"], attrs["stop"]
    start = start + dim if start < 0 else start
    stop = stop + dim if stop < 0 else stop
    if not 0 <= start < stop <= dim:
        raise OpError(
            "E-SHAPE-001",
            f"slice: :start {attrs['start']} :stop {attrs['stop']} is empty or outside axis {axis} of {dims_text(x.shape)}.",
        )
    shape = x.shape[:axis] + (stop - start,) + x.shape[axis + 1 :]
    return x.dtype, shape, {"axis": axis, "start": start, "stop": stop}


def _vjp_slice(e, node, g):
    (x,) = node.inputs
    axis, start, stop = node.attrs["axis"], node.attrs["start"], node.attrs["stop"]
    return (e("pad", g, axis=axis, before=start, after=x.shape[axis] - stop),)


def _infer_pad(inputs, attrs):
    (x,) = inputs
    axis = _axis("pad", attrs["axis"], x.rank)
    before, after = attrs["before"], attrs["after"]
    shape = x.shape[:axis] + (before + x.shape[axis] + after,) + x.shape[axis + 1 :]
    return x.dtype, shape, {"axis": axis, "before": before, "after": after}


def _vjp_pad(e, node, g):
    (x,) = node.inputs
    axis, before = node.attrs["axis"], node.attrs["before"]
    return (e("slice", g, axis=axis, start=before, stop=before + x.shape[axis]),)


def _infer_concat(inputs, attrs):
    if not inputs:
        raise OpError("E-GRAPH-003", "concat needs at least one tensor.")
    first = inputs[0]
    dtype = _same_dtype("concat", inputs)
    axis = _axis("concat", attrs["axis"], first.rank)
    for other in inputs[1:]:
        if other.rank != first.rank or any(
            a != b for index, (a, b) in enumerate(zip(first.shape, other.shape)) if index != axis
        ):
            raise OpError(
                "E-SHAPE-001",
                f"concat: shapes {dims_text(first.shape)} and {dims_text(other.shape)} differ off axis {axis}.",
            )
    total = sum(node.shape[axis] for node in inputs)
    return dtype, first.shape[:axis] + (total,) + first.shape[axis + 1 :], {"axis": axis}


def _vjp_concat(e, node, g):
    axis = node.attrs["axis"]
    grads, start = [], 0
    for source in node.inputs:
        stop = start + source.shape[axis]
        grads.append(e("slice", g, axis=axis, start=start, stop=stop))
        start = stop
    return tuple(grads)


def _infer_broadcast(inputs, attrs):
    (x,) = inputs
    shape = tuple(attrs["shape"])
    if len(shape) < x.rank or broadcast_shapes("broadcast", x.shape, shape) != shape:
        raise OpError("E-SHAPE-001", f"broadcast: {dims_text(x.shape)} does not broadcast to {dims_text(shape)}.")
    return x.dtype, shape, {"shape": shape}


def _vjp_broadcast(e, node, g):
    return (e.unbroadcast(g, node.inputs[0].shape),)


_register("reshape", "movement", _infer_reshape, _vjp_reshape, 1)
_register("transpose", "movement", _infer_transpose, _vjp_transpose, 1,
          mixes_rows=lambda node, stacked: node.attrs["perm"][0] != 0)
_register("slice", "movement", _infer_slice, _vjp_slice, 1, mixes_rows=_along_first_axis)
_register("pad", "movement", _infer_pad, _vjp_pad, 1, mixes_rows=_along_first_axis)
_register("concat", "movement", _infer_concat, _vjp_concat, None, mixes_rows=_along_first_axis)
_register("broadcast", "movement", _infer_broadcast, _vjp_broadcast, 1)


# --- contract ------------------------------------------------------------------------------------------------


def _infer_matmul(inputs, attrs):
    a, b = inputs
    dtype = _same_dtype("matmul", inputs)
    _require_dtype("matmul", a, FLOAT_DTYPES, "the dtype of its inputs")
    if a.rank < 2 or b.rank < 2:
        raise OpError("E-SHAPE-001", f"matmul: needs two matrices (rank >= 2), got {dims_text(a.shape)} and {dims_text(b.shape)}.")
    if a.shape[-1] != b.shape[-2]:
        raise OpError(
            "E-SHAPE-001",
            f"matmul: shapes {dims_text(a.shape)} and {dims_text(b.shape)} do not chain: "
            f"{a.shape[-1]} columns against {b.shape[-2]} rows.",
        )
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    return dtype, batch + (a.shape[-2], b.shape[-1]), attrs


def _swap_last(e, x):
    perm = tuple(range(x.rank - 2)) + (x.rank - 1, x.rank - 2)
    return e("transpose", x, perm=perm)


def _vjp_matmul(e, node, g):
    a, b = node.inputs
    if b.rank == 2 and a.rank > 2:
        # a weight shared by every leading position: one product whose sum runs over all of
        # them in C order, instead of a product per position followed by a sum
        rows_a = e("reshape", a, shape=(a.size // a.shape[-1], a.shape[-1]))
        rows_g = e("reshape", g, shape=(g.size // g.shape[-1], g.shape[-1]))
        grad_b = e("matmul", _swap_last(e, rows_a), rows_g)
    else:
        grad_b = e.unbroadcast(e("matmul", _swap_last(e, a), g), b.shape)
    grad_a = e.unbroadcast(e("matmul", g, _swap_last(e, b)), a.shape)
    return grad_a, grad_b


_register("matmul", "contract", _infer_matmul, _vjp_matmul, 2)


# --- attention -------------------------------------------------------------------------------------------------
# Scaled dot-product attention over the last two axes, one op so that a backend may fuse it:
# - attention_core(q, k, v): q (..., TQ, E), k (..., TK, E), v (..., TK, EV), the same leading
#   axes, no broadcasting -> (..., TQ, EV): softmax(where(mask, (q @ k^T) * scale, -inf)) @ v,
#   the steps of the composition it replaces, in their order; attrs scale (float) and causal
#   (bool; the mask is causal_mask(T), which needs TQ == TK; without it every key is seen).
# - attention_grad_q(q, k, v, o, g) -> (..., TQ, E) and attention_grad_kv(q, k, v, o, g) ->
#   (..., TK, E + EV), dk then dv along the last axis: the cotangents of q, k and v for the
#   cotangent g of the output o. With P the forward's probabilities, dP = g @ v^T,
#   D = rowsum(g * o) (equal to rowsum(dP * P) when o is the forward's output) and
#   dS = P * (dP - D): dq = (dS @ k) * scale, dk = (dS^T @ q) * scale, dv = P^T @ g.
# Their decompositions write that formula out in this order; the exact modes of both backends
# sum the decomposed graph, so its nodes and their order are part of its bits. The parts of one
# attention share their nodes (Emitter.once): P is made once for the output and both
# cotangents, dS once for dq and dk, so a decomposed backward multiplies by v^T once and never
# recomputes the scores; each attention's P (T x T a head) then lives from forward to backward.
# The interpreter's fused orders and bf16 rounding points are in backends/cpu/op_kernels.py.


def _attention_operands(op: str, q, k, v, attrs) -> dict:
    for node, name in ((q, "q"), (k, "k"), (v, "v")):
        _require_dtype(op, node, FLOAT_DTYPES, f"its {name}")
        if node.rank < 2:
            raise OpError("E-SHAPE-001", f"{op}: {name} needs (... T E), got {dims_text(node.shape)}.")
    _same_dtype(op, (q, k, v))
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise OpError("E-SHAPE-001", f"{op}: q {dims_text(q.shape)}, k {dims_text(k.shape)} and v {dims_text(v.shape)} "
                                     "need the same leading axes, q and k the same width, k and v the same length.")
    causal, scale = bool(attrs["causal"]), float(attrs["scale"])
    if causal and q.shape[-2] != k.shape[-2]:
        raise OpError("E-SHAPE-001", f"{op}: a causal mask needs as many queries as keys, got {q.shape[-2]} and {k.shape[-2]}.")
    if not math.isfinite(scale):
        raise OpError("E-GRAPH-003", f"{op}: :scale must be a finite number, found {scale}.")
    return {"causal": causal, "scale": scale}


def _infer_attention_core(inputs, attrs):
    q, k, v = inputs
    canonical = _attention_operands("attention", q, k, v, attrs)
    return q.dtype, q.shape[:-1] + v.shape[-1:], canonical


def _attention_cotangent_operands(op: str, inputs, attrs) -> dict:
    q, k, v, o, g = inputs
    canonical = _attention_operands(op, q, k, v, attrs)
    _same_dtype(op, inputs)
    expected = q.shape[:-1] + v.shape[-1:]
    if o.shape != expected or g.shape != expected:
        raise OpError("E-SHAPE-001", f"{op}: the output and its cotangent must be {dims_text(expected)}, "
                                     f"got {dims_text(o.shape)} and {dims_text(g.shape)}.")
    return canonical


def _infer_attention_grad_q(inputs, attrs):
    canonical = _attention_cotangent_operands("attention_grad_q", inputs, attrs)
    return inputs[0].dtype, inputs[0].shape, canonical


def _infer_attention_grad_kv(inputs, attrs):
    canonical = _attention_cotangent_operands("attention_grad_kv", inputs, attrs)
    k, v = inputs[1], inputs[2]
    return k.dtype, k.shape[:-1] + (k.shape[-1] + v.shape[-1],), canonical


def _vjp_attention_core(e, node, g):
    q, k, v = node.inputs
    attrs = dict(node.attrs)
    grad_q = e("attention_grad_q", q, k, v, node, g, **attrs)
    grad_kv = e("attention_grad_kv", q, k, v, node, g, **attrs)
    axis, width = k.rank - 1, k.shape[-1]
    grad_k = e("slice", grad_kv, axis=axis, start=0, stop=width)
    grad_v = e("slice", grad_kv, axis=axis, start=width, stop=grad_kv.shape[-1])
    return grad_q, grad_k, grad_v


def _scaled(e, x, attrs):
    return e("mul", x, e.const(attrs["scale"], like=x))


def _attention_probabilities(e, attrs, q, k):
    """P = softmax(where(causal_mask, (q @ k^T) * scale, -inf)) along the keys."""
    def make():
        scores = _scaled(e, e("matmul", q, _swap_last(e, k)), attrs)
        if attrs["causal"]:
            mask = e("causal_mask", size=scores.shape[-1])
            scores = e("where", mask, scores, e.const(float("-inf"), like=scores))
        return e("softmax", scores, axis=scores.rank - 1)

    return e.once(("P", attrs["scale"], attrs["causal"], q, k), make)


def _attention_score_cotangent(e, attrs, q, k, v, o, g):
    """dS = P * (g @ v^T - D), D = sum(g * o) along the output's width, spread over the keys."""
    def make():
        probabilities = _attention_probabilities(e, attrs, q, k)
        spread = e("broadcast", e("sum", e("mul", g, o), axes=(g.rank - 1,), keep=True), shape=probabilities.shape)
        return e("mul", probabilities, e("sub", e("matmul", g, _swap_last(e, v)), spread))

    return e.once(("dS", attrs["scale"], attrs["causal"], q, k, v, o, g), make)


def _decompose_attention_core(e, attrs, q, k, v):
    return e("matmul", _attention_probabilities(e, attrs, q, k), v)


def _decompose_attention_grad_q(e, attrs, q, k, v, o, g):
    return _scaled(e, e("matmul", _attention_score_cotangent(e, attrs, q, k, v, o, g), k), attrs)


def _decompose_attention_grad_kv(e, attrs, q, k, v, o, g):
    grad_k = _scaled(e, e("matmul", _swap_last(e, _attention_score_cotangent(e, attrs, q, k, v, o, g)), q), attrs)
    grad_v = e("matmul", _swap_last(e, _attention_probabilities(e, attrs, q, k)), g)
    return e("concat", grad_k, grad_v, axis=grad_k.rank - 1)


def _positions_first(node, stacked) -> bool:
    return node.rank <= 2  # the first axis is the positions every query reads


_register("attention_core", "attention", _infer_attention_core, _vjp_attention_core, 3,
          decompose=_decompose_attention_core, mixes_rows=_positions_first)
_register("attention_grad_q", "attention", _infer_attention_grad_q, None, 5, decompose=_decompose_attention_grad_q,
          mixes_rows=_positions_first)
_register("attention_grad_kv", "attention", _infer_attention_grad_kv, None, 5,
          decompose=_decompose_attention_grad_kv, mixes_rows=_positions_first)


# --- window --------------------------------------------------------------------------------------------------
# Convolution and pooling over the last two axes of NCHW values: N images, C channels, H rows,
# W columns. Every geometric attribute is a pair (rows, columns) of ints:
# - conv2d(x, w): x (N, C, H, W), w (O, C, KH, KW) -> (N, O, OH, OW), a cross-correlation (no
#   kernel flip, as torch's conv2d and cuDNN's CROSS_CORRELATION mode); attrs stride (>= 1) and
#   padding (>= 0 zeros before and after each spatial axis); no dilation, one group;
#   OH = (H + 2 * padding[0] - KH) // stride[0] + 1, OW likewise.
# - conv2d_input_grad(g, w): the cotangent of conv2d's x (cuDNN's backward-data); attrs stride,
#   padding and input_shape (N, C, H, W), which g's shape cannot give when stride > 1.
# - conv2d_weight_grad(x, g): the cotangent of conv2d's w (cuDNN's backward-filter); attrs
#   stride, padding and weight_shape (O, C, KH, KW).
# - max_pool2d(x), avg_pool2d(x): attrs kernel (>= 1) and stride (>= 1); no padding, and rows
#   or columns that do not fill a last window are left out (floor), as torch's default.
# - max_pool2d_grad(x, g): each window's cotangent goes to the window's first maximum, the
#   first element in the window's row-major order that compares equal to it (the first NaN
#   when it is NaN); max_pool2d_pick(x, h) reads h there (the adjoint, for second derivatives).
# - avg_pool2d_grad(g): each window's cotangent divided by KH * KW, spread over the window;
#   attrs kernel, stride and input_shape (N, C, H, W).
# The interpreter's summation orders are documented in backends/cpu/windows.py.


def _pair(op: str, name: str, value, low: int) -> tuple:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v < low for v in pair):
        found = value if isinstance(value, int) else dims_text(pair) if all(isinstance(v, int) for v in pair) else repr(value)
        raise OpError("E-GRAPH-003", f"{op}: :{name} must be an integer or two integers of at least {low}, found {found}.")
    return pair


def _window_count(op: str, size, kernel, stride, padding) -> tuple:
    """(OH, OW): how many windows of `kernel` fit in `size` padded by `padding`, `stride` apart."""
    counts = tuple((dim + 2 * pad - k) // step + 1 for dim, k, step, pad in zip(size, kernel, stride, padding))
    if any(dim + 2 * pad < k for dim, k, pad in zip(size, kernel, padding)):
        padded = f" padded by {dims_text(padding)}" if any(padding) else ""
        raise OpError("E-SHAPE-001", f"{op}: a {dims_text(kernel)} window does not fit in {dims_text(size)}{padded}.")
    return counts


def _image(op: str, node, what: str = "its input") -> None:
    _require_dtype(op, node, FLOAT_DTYPES, what)
    if node.rank != 4:
        raise OpError("E-SHAPE-001", f"{op}: {what} must be (N C H W), got {dims_text(node.shape)}.")


def _conv_geometry(op: str, attrs) -> dict:
    return {"stride": _pair(op, "stride", attrs.get("stride", 1), 1), "padding": _pair(op, "padding", attrs.get("padding", 0), 0)}


def _conv_result(op: str, x_shape, w_shape, geometry) -> tuple:
    """The shape conv2d gives an input of `x_shape` and a weight of `w_shape`."""
    if x_shape[1] != w_shape[1]:
        raise OpError("E-SHAPE-001", f"{op}: the input {dims_text(x_shape)} has {x_shape[1]} channels, "
                                     f"the weight {dims_text(w_shape)} expects {w_shape[1]}.")
    rows, cols = _window_count(op, x_shape[2:], w_shape[2:], geometry["stride"], geometry["padding"])
    return (x_shape[0], w_shape[0], rows, cols)


def _given_shape(op: str, attrs, name: str) -> tuple:
    shape = tuple(attrs[name])
    if len(shape) != 4 or any(not isinstance(dim, int) or dim < 1 for dim in shape):
        raise OpError("E-SHAPE-001", f"{op}: {name} must be four dimensions of at least 1, found {shape!r}.")
    return shape


def _check_cotangent(op: str, g, expected) -> None:
    if g.shape != tuple(expected):
        raise OpError("E-SHAPE-001", f"{op}: the cotangent is {dims_text(g.shape)}, expected {dims_text(expected)}.")


def _conv_inputs(op: str, inputs, attrs, roles) -> tuple:
    """(dtype, canonical stride and padding) of a convolution op whose inputs play `roles`."""
    dtype = _same_dtype(op, inputs)
    for node, role in zip(inputs, roles):
        _image(op, node, role)
    return dtype, _conv_geometry(op, attrs)


def _infer_conv2d(inputs, attrs):
    x, w = inputs
    dtype, geometry = _conv_inputs("conv2d", inputs, attrs, ("its input", "its weight"))
    return dtype, _conv_result("conv2d", x.shape, w.shape, geometry), geometry


def _infer_conv2d_input_grad(inputs, attrs):
    op, (g, w) = "conv2d_input_grad", inputs
    dtype, geometry = _conv_inputs(op, inputs, attrs, ("its cotangent", "its weight"))
    shape = _given_shape(op, attrs, "input_shape")
    _check_cotangent(op, g, _conv_result(op, shape, w.shape, geometry))
    return dtype, shape, dict(geometry, input_shape=shape)


def _infer_conv2d_weight_grad(inputs, attrs):
    op, (x, g) = "conv2d_weight_grad", inputs
    dtype, geometry = _conv_inputs(op, inputs, attrs, ("its input", "its cotangent"))
    shape = _given_shape(op, attrs, "weight_shape")
    _check_cotangent(op, g, _conv_result(op, x.shape, shape, geometry))
    return dtype, shape, dict(geometry, weight_shape=shape)


def _geometry_of(node) -> dict:
    return {"stride": node.attrs["stride"], "padding": node.attrs["padding"]}


def _vjp_conv2d(e, node, g):
    x, w = node.inputs
    geometry = _geometry_of(node)
    return (e("conv2d_input_grad", g, w, input_shape=x.shape, **geometry),
            e("conv2d_weight_grad", x, g, weight_shape=w.shape, **geometry))


def _vjp_conv2d_input_grad(e, node, h):
    # <h, conv2d_input_grad(g, w)> = <conv2d(h, w), g>, bilinear in (g, w)
    g, w = node.inputs
    geometry = _geometry_of(node)
    return e("conv2d", h, w, **geometry), e("conv2d_weight_grad", h, g, weight_shape=w.shape, **geometry)


def _vjp_conv2d_weight_grad(e, node, k):
    # <k, conv2d_weight_grad(x, g)> = <conv2d(x, k), g>, bilinear in (x, g)
    x, g = node.inputs
    geometry = _geometry_of(node)
    return e("conv2d_input_grad", g, k, input_shape=x.shape, **geometry), e("conv2d", x, k, **geometry)


def _pool_window(op: str, attrs) -> dict:
    kernel = _pair(op, "kernel", attrs["kernel"], 1)
    return {"kernel": kernel, "stride": _pair(op, "stride", attrs.get("stride") or kernel, 1)}


def _pooled(op: str, shape, window) -> tuple:
    return tuple(shape[:2]) + _window_count(op, shape[2:], window["kernel"], window["stride"], (0, 0))


def _infer_pool(op: str):
    def infer(inputs, attrs):
        (x,) = inputs
        _image(op, x)
        window = _pool_window(op, attrs)
        return x.dtype, _pooled(op, x.shape, window), window

    return infer


def _infer_max_pool2d_grad(inputs, attrs):
    x, g = inputs
    dtype = _same_dtype("max_pool2d_grad", inputs)
    _image("max_pool2d_grad", x)
    window = _pool_window("max_pool2d_grad", attrs)
    _check_cotangent("max_pool2d_grad", g, _pooled("max_pool2d_grad", x.shape, window))
    return dtype, x.shape, window


def _infer_max_pool2d_pick(inputs, attrs):
    x, h = inputs
    dtype = _same_dtype("max_pool2d_pick", inputs)
    _image("max_pool2d_pick", x)
    _check_cotangent("max_pool2d_pick", h, x.shape)
    window = _pool_window("max_pool2d_pick", attrs)
    return dtype, _pooled("max_pool2d_pick", x.shape, window), window


def _infer_avg_pool2d_grad(inputs, attrs):
    (g,) = inputs
    _image("avg_pool2d_grad", g, "its cotangent")
    window = _pool_window("avg_pool2d_grad", attrs)
    shape = _given_shape("avg_pool2d_grad", attrs, "input_shape")
    _check_cotangent("avg_pool2d_grad", g, _pooled("avg_pool2d_grad", shape, window))
    return g.dtype, shape, dict(window, input_shape=shape)


def _window_of(node) -> dict:
    return {"kernel": node.attrs["kernel"], "stride": node.attrs["stride"]}


def _vjp_max_pool2d(e, node, g):
    (x,) = node.inputs
    return (e("max_pool2d_grad", x, g, **_window_of(node)),)


def _vjp_routed(adjoint: str):
    # max_pool2d_grad and max_pool2d_pick are each other's adjoint in their second input; the
    # routing is constant where the first maxima do not move, so x gets no cotangent
    return lambda e, node, h: (None, e(adjoint, node.inputs[0], h, **_window_of(node)))


def _vjp_avg_pool2d(e, node, g):
    (x,) = node.inputs
    return (e("avg_pool2d_grad", g, input_shape=x.shape, **_window_of(node)),)


def _vjp_avg_pool2d_grad(e, node, h):
    return (e("avg_pool2d", h, **_window_of(node)),)


_register("conv2d", "window", _infer_conv2d, _vjp_conv2d, 2, precision=PRODUCT)
_register("conv2d_input_grad", "window", _infer_conv2d_input_grad, _vjp_conv2d_input_grad, 2, precision=PRODUCT)
_register("conv2d_weight_grad", "window", _infer_conv2d_weight_grad, _vjp_conv2d_weight_grad, 2, precision=PRODUCT)
_register("max_pool2d", "window", _infer_pool("max_pool2d"), _vjp_max_pool2d, 1, precision=MOVES)
_register("max_pool2d_grad", "window", _infer_max_pool2d_grad, _vjp_routed("max_pool2d_pick"), 2, precision=MOVES)
_register("max_pool2d_pick", "window", _infer_max_pool2d_pick, _vjp_routed("max_pool2d_grad"), 2, precision=MOVES)
_register("avg_pool2d", "window", _infer_pool("avg_pool2d"), _vjp_avg_pool2d, 1, precision=ARITHMETIC)
_register("avg_pool2d_grad", "window", _infer_avg_pool2d_grad, _vjp_avg_pool2d_grad, 1, precision=ARITHMETIC)


# --- Exact arithmetic (graph/passes/exact_region.py) -------------------------------------------
# dtype "acc": an exact sum whose rounding is deferred; `round` rounds each once, to nearest
# even. A node with the attribute exact=True is its op's exact form: each sum in it exact and
# rounded once. Backends register both in their exact rule tables.

ACC = "acc"
EXACT_ONLY = ("round",)  # ops only exact graphs hold: float rule tables need no rule for them


def _infer_round(inputs, attrs):
    (x,) = inputs
    _require_dtype("round", x, (ACC,))
    if attrs.get("dtype") not in FLOAT_DTYPES:
        raise OpError("E-DTYPE-001", f"round: rounds into f32 or bf16, not {attrs.get('dtype')}.")
    return attrs["dtype"], x.shape, {"dtype": attrs["dtype"]}


_register("round", "exact", _infer_round, None, 1, precision=ARITHMETIC)
