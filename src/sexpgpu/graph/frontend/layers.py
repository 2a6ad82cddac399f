"""The built-in ops of the language (docs/language.md, "Built-in ops" and "Draws").

Each entry declares its positional arguments and keywords; `Builtin.application` checks a
call against them (E-GRAPH-003) and hands the converted values to the entry's builder, which
emits IR through the op table with the `Builder` `b` evaluating the call: build.py looks calls
up in `BUILTINS`, and this module knows the Builder only by what it calls on it. Derived ops
are compositions:

- mean = sum / count; mse = mean(square(pred - target));
  cross-entropy = sum(cross_entropy(logits, labels)) / positions;
- linear = x @ transpose(w) + b, w (OUT, IN) `(glorot-uniform)`, b (OUT) `zeros`;
- embedding = gather(table, ids), table (V, D) `(normal :mean 0 :std 1)`;
- layernorm = layernorm(x) * gain + bias, gain `ones`, bias `zeros`;
- attention: q k v = x @ transpose(wq wk wv), split into heads, attention_core(q, k, v) with
  scale 1/sqrt(d) (one op of the table: softmax(where(causal_mask, q @ k^T * scale, -inf)) @ v,
  those steps in that order), heads merged, @ transpose(wo); each w (D, D) `(glorot-uniform)`;
- gelu = (x * 0.5) * (1 + erf(x * (1/sqrt 2))), the erf form;
- dropout = (x * cast(keep)) / (1 - p), keep = bernoulli(1 - p) drawn with the salt; the
  identity in passes;
- conv2d = conv2d(x, w) + reshape(b, (OUT, 1, 1)), w (OUT, IN, KH, KW) `(glorot-uniform)`,
  b (OUT) `zeros`; max-pool and avg-pool are the max_pool2d and avg_pool2d ops, :stride
  defaulting to :kernel.
A layer's parameters are float32; on a bf16 input the layer casts them to bf16 where it
reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from sexpgpu.errors import did_you_mean
from sexpgpu.graph.frontend.records import Frame, Initializer, initializer_of, join_path
from sexpgpu.graph.core.ir import FLOAT_DTYPES, Node
from sexpgpu.graph.core.ops import dims_text
from sexpgpu.lang.keywords import REQUIRED, first_keyword, split_pairs
from sexpgpu.lang.syntax import SList, Symbol, describe


@dataclass(frozen=True)
class Builtin:
    name: str
    positional: tuple  # argument kinds; a kind ending in "*" takes one or more
    keywords: dict  # keyword -> (kind, default or REQUIRED)
    build: Callable  # build(b, frame, *positional values, **keyword values)

    def application(self, b, form: SList, frame: Frame):
        """The steps of applying this op to `form` (values of its arguments are yielded for)."""
        end = 1 + first_keyword(form.items[1:])
        given = form.items[1:end]
        variadic = self.positional and self.positional[-1].endswith("*")
        if (len(given) < len(self.positional)) if variadic else (len(given) != len(self.positional)):
            wanted = f"at least {len(self.positional)}" if variadic else str(len(self.positional))
            place = given[len(self.positional)].loc if len(given) > len(self.positional) else form.loc
            raise b.error("E-GRAPH-003", f"({self.name} ...) takes {wanted} argument(s), found {len(given)}.", place)
        kinds = list(self.positional[:-1]) + [self.positional[-1].rstrip("*")] * (len(given) - len(self.positional) + 1) \
            if variadic else list(self.positional)
        args = []
        for kind, item in zip(kinds, given):
            args.append((yield b.evaluation(item, frame)) if kind == "value" else _convert(b, kind, item, frame))
        return self.build(b, frame, *args, **self._keywords(b, form, end, frame))

    def _keywords(self, b, form: SList, end: int, frame: Frame) -> dict:
        pairs = split_pairs(form.items[end:], f"({self.name} ...)")
        values = {}
        for name, (key, value) in pairs.items():
            if name not in self.keywords:
                known = ", ".join(":" + k for k in self.keywords) or "none"
                raise b.error("E-GRAPH-003", f"unknown keyword {key} for ({self.name} ...): it takes {known}.",
                              key.loc, did_you_mean(name, list(self.keywords), ":"))
            values[name] = _convert(b, self.keywords[name][0], value, frame, f":{name} of ({self.name} ...)")
        for name, (kind, default) in self.keywords.items():
            if name not in values:
                if default is REQUIRED:
                    raise b.error("E-GRAPH-003", f"({self.name} ...) needs :{name}.", form.loc)
                values[name] = default
        return {_python_name(name): value for name, value in values.items()}


def _python_name(keyword: str) -> str:
    return "as_" if keyword == "as" else keyword.replace("-", "_")


def _convert(b, kind: str, item, frame: Frame, label: str | None = None):
    if kind == "dims":
        return b.dims(item, frame)
    if kind == "shape":
        return b.dims(item, frame, allow_unknown=True)
    if kind == "int":
        return b.static_int(item, frame, label=label)
    if kind == "size":
        return b.static_size(item, frame, label)
    if kind == "number":
        return b.static_number(item, frame)
    if kind == "bool":
        return b.static_bool(item, frame)
    if kind == "pair":
        items = item.items if isinstance(item, SList) else (item,)
        values = tuple(b.static_int(value, frame, "an integer, or a list of two like (3 3)") for value in items)
        if len(values) != 2 and not (len(values) == 1 and not isinstance(item, SList)):
            raise b.error("E-GRAPH-003", f"expected an integer, or a list of two like (3 3), found {describe(item)}.", item.loc)
        return values * 2 if len(values) == 1 else values
    if kind == "axes":
        items = item.items if isinstance(item, SList) else (item,)
        return tuple(b.static_int(axis, frame, "an axis (an integer)") for axis in items)
    if kind == "axis-list":
        if not isinstance(item, SList):
            raise b.error("E-GRAPH-003", f"expected a list of axes like (1 0), found {describe(item)}.", item.loc)
        return tuple(b.static_int(axis, frame, "an axis (an integer)") for axis in item.items)
    if kind == "dtype":
        if not isinstance(item, Symbol) or item.name not in ("f32", "bf16", "i32"):
            raise b.error("E-GRAPH-003", f"expected a dtype (f32, bf16 or i32), found {describe(item)}.", item.loc,
                          did_you_mean(item.name, ("f32", "bf16", "i32")) if isinstance(item, Symbol) else None)
        return item.name
    if kind == "scope":
        return b.scope_name(item)
    if kind == "init":
        from sexpgpu.lang.initializers import read_initializer

        return initializer_of(read_initializer(item))
    if kind == "salt":
        from sexpgpu.lang.salts import read_salt

        return read_salt(item)
    raise AssertionError(kind)


BUILTINS: dict = {}


def builtin(name: str, positional: tuple, keywords: dict | None = None):
    """A decorator adding `build` as the language's op `name` (docs/language.md lists them);
    `del BUILTINS[name]` takes it back."""
    def register(build):
        BUILTINS[name] = Builtin(name, positional, keywords or {}, build)
        return build

    return register


def _float_tensor(b, value, what: str) -> Node:
    node = b.tensor(value)
    if node.dtype not in FLOAT_DTYPES:
        raise b.error("E-DTYPE-001", f"{what} needs a float tensor (f32 or bf16), got {node.dtype}.", b.e.loc)
    return node


# --- elementwise ------------------------------------------------------------------------------


def _binary(op: str):
    def build(b, frame, x, y):
        return b.emit(op, *b.tensors([x, y]))

    return build


def unary(op: str):
    """The builder of a built-in that applies the IR op `op` to its one argument."""
    def build(b, frame, x):
        return b.emit(op, b.tensor(x))

    return build


for _name in ("add", "sub", "mul", "div", "matmul"):
    builtin(_name, ("value", "value"))(_binary(_name))
for _name in ("neg", "relu", "tanh", "exp", "log", "sqrt", "rsqrt", "sigmoid", "square"):
    builtin(_name, ("value",))(unary(_name))


@builtin("gelu", ("value",))
def _gelu(b, frame, x):
    """(x * 0.5) * (1 + erf(x * (1/sqrt 2))): the steps of the `gelu` op, as nodes, so that the
    gradient reuses the forward's erf instead of computing it again."""
    x = _float_tensor(b, x, "gelu")
    scaled = b.emit("mul", x, b.const(1.0 / math.sqrt(2.0), like=x))
    return b.emit("mul", b.emit("mul", x, b.const(0.5, like=x)), b.emit("add", b.const(1.0, like=x), b.emit("erf", scaled)))


@builtin("pow", ("value", "number"))
def _pow(b, frame, x, exponent):
    x = _float_tensor(b, x, "pow")
    return b.emit("pow", x, b.const(exponent, like=x))


@builtin("cast", ("value", "dtype"))
def _cast(b, frame, x, dtype):
    x = b.tensor(x)
    return x if x.dtype == dtype else b.emit("cast", x, dtype=dtype)


# --- reductions and normalisations --------------------------------------------------------------


def _reduction(op: str):
    def build(b, frame, x, axis, keep):
        x = b.tensor(x)
        total = b.emit("sum" if op == "mean" else op, x, axes=axis, keep=keep)
        if op != "mean":
            return total
        if x.dtype not in FLOAT_DTYPES:
            raise b.error("E-DTYPE-001", f"mean needs a float tensor (f32 or bf16), got {x.dtype}.", b.e.loc)
        return b.emit("div", total, b.const(x.size // max(total.size, 1), like=total))

    return build


for _name in ("sum", "mean", "max"):
    builtin(_name, ("value",), {"axis": ("axes", None), "keep": ("bool", False)})(_reduction(_name))


@builtin("softmax", ("value",), {"axis": ("int", -1)})
def _softmax(b, frame, x, axis):
    return b.emit("softmax", b.tensor(x), axis=axis)


@builtin("log-softmax", ("value",), {"axis": ("int", -1)})
def _log_softmax(b, frame, x, axis):
    return b.emit("log_softmax", b.tensor(x), axis=axis)


def cross_entropy_mean(b, logits: Node, labels: Node) -> Node:
    per_position = b.emit("cross_entropy", logits, labels)
    total = b.emit("sum", per_position, axes=None, keep=False)
    return b.emit("div", total, b.const(max(per_position.size, 1), like=total))


def mse(b, prediction: Node, target: Node) -> Node:
    if prediction.shape != target.shape:
        raise b.error("E-SHAPE-001", f"mse: prediction {dims_text(prediction.shape)} and target "
                                     f"{dims_text(target.shape)} differ in shape.", b.e.loc)
    squared = b.emit("square", b.emit("sub", prediction, target))
    total = b.emit("sum", squared, axes=None, keep=False)
    return b.emit("div", total, b.const(max(squared.size, 1), like=total))


@builtin("cross-entropy", ("value", "value"))
def _cross_entropy(b, frame, logits, labels):
    return cross_entropy_mean(b, b.tensor(logits), b.tensor(labels))


@builtin("mse", ("value", "value"))
def _mse(b, frame, prediction, target):
    return mse(b, *b.tensors([prediction, target]))


# --- movement -------------------------------------------------------------------------------------


@builtin("reshape", ("value", "shape"))
def _reshape(b, frame, x, shape):
    x = b.tensor(x)
    if shape.count(-1) > 1:
        raise b.error("E-SHAPE-001", f"reshape: at most one dimension may be -1, found {dims_text(shape)}.", b.e.loc)
    if -1 in shape:
        known = math.prod(dim for dim in shape if dim != -1)
        if x.size % known:
            raise b.error("E-SHAPE-001", f"reshape: cannot reshape {dims_text(x.shape)} ({x.size} elements) "
                                         f"to {dims_text(shape)}.", b.e.loc)
        shape = tuple(x.size // known if dim == -1 else dim for dim in shape)
    return b.emit("reshape", x, shape=shape)


@builtin("transpose", ("value", "axis-list"))
def _transpose(b, frame, x, perm):
    x = b.tensor(x)
    return b.emit("transpose", x, perm=tuple(axis % max(x.rank, 1) if -x.rank <= axis < 0 else axis for axis in perm))


@builtin("slice", ("value",), {"axis": ("int", REQUIRED), "start": ("int", 0), "stop": ("int", None)})
def _slice(b, frame, x, axis, start, stop):
    x = b.tensor(x)
    if not -x.rank <= axis < max(x.rank, 1):
        raise b.error("E-GRAPH-003", f"slice: axis {axis} is out of range for {dims_text(x.shape)}.", b.e.loc)
    return b.emit("slice", x, axis=axis, start=start, stop=x.shape[axis] if stop is None else stop)


@builtin("concat", ("value*",), {"axis": ("int", REQUIRED)})
def _concat(b, frame, *xs, axis):
    return b.emit("concat", *b.tensors(xs), axis=axis)


@builtin("broadcast", ("value", "dims"))
def _broadcast(b, frame, x, shape):
    return b.emit("broadcast", b.tensor(x), shape=shape)


# --- layers ---------------------------------------------------------------------------------------

_GLOROT = Initializer("glorot-uniform")
_ZEROS = Initializer("zeros")
_ONES = Initializer("ones")
_NORMAL = Initializer("normal", (("mean", 0.0), ("std", 1.0)))


def _layer_frame(frame: Frame, scope: str) -> Frame:
    return Frame(frame.env, join_path(frame.scope, scope), frame.graph_name)


def _weight(b, frame: Frame, name: str, shape: tuple, init, reader: Node) -> Node:
    """A float32 layer parameter, cast to the dtype of the tensor that reads it."""
    node = b.declare_param(frame, name, shape, "f32", init, None, b.e.loc)
    with b.e.at(scope=frame.scope):
        return node if reader.dtype == "f32" else b.emit("cast", node, dtype=reader.dtype)


def _times_transposed(b, x: Node, w: Node) -> Node:
    """x @ w^T for w (OUT, IN)."""
    return b.emit("matmul", x, b.emit("transpose", w, perm=(1, 0)))


@builtin("linear", ("value",), {"out": ("size", REQUIRED), "as": ("scope", REQUIRED),
                                 "bias": ("bool", True), "init": ("init", _GLOROT)})
def _linear(b, frame, x, out, as_, bias, init):
    x = _float_tensor(b, x, "linear")
    if x.rank == 0 or out < 1:
        raise b.error("E-SHAPE-001", f"linear needs an input with a feature axis and :out at least 1, "
                                     f"got {dims_text(x.shape)} and :out {out}.", b.e.loc)
    inner = _layer_frame(frame, as_)
    w = _weight(b, inner, "w", (out, x.shape[-1]), init, x)
    with b.e.at(scope=inner.scope):
        rows = x if x.rank >= 2 else b.emit("reshape", x, shape=(1, x.shape[0]))
        y = _times_transposed(b, rows, w)
        if x.rank < 2:
            y = b.emit("reshape", y, shape=(out,))
        if bias:
            y = b.emit("add", y, _weight(b, inner, "b", (out,), _ZEROS, x))
    return y


@builtin("embedding", ("value",), {"vocab": ("size", REQUIRED), "dim": ("size", REQUIRED),
                                    "as": ("scope", REQUIRED), "init": ("init", _NORMAL)})
def _embedding(b, frame, ids, vocab, dim, as_, init):
    ids = b.tensor(ids)
    if ids.dtype != "i32":
        raise b.error("E-DTYPE-001", f"embedding needs i32 ids, got {ids.dtype}.", b.e.loc)
    inner = _layer_frame(frame, as_)
    table = b.declare_param(inner, "table", (vocab, dim), "f32", init, None, b.e.loc)
    with b.e.at(scope=inner.scope):
        return b.emit("gather", table, ids)


@builtin("layernorm", ("value",), {"as": ("scope", REQUIRED), "eps": ("number", 1e-5)})
def _layernorm(b, frame, x, as_, eps):
    x = _float_tensor(b, x, "layernorm")
    inner = _layer_frame(frame, as_)
    width = x.shape[-1] if x.rank else 1
    gain = _weight(b, inner, "gain", (width,), _ONES, x)
    bias = _weight(b, inner, "bias", (width,), _ZEROS, x)
    with b.e.at(scope=inner.scope):
        return b.emit("add", b.emit("mul", b.emit("layernorm", x, eps=eps), gain), bias)


@builtin("attention", ("value",), {"heads": ("size", REQUIRED), "as": ("scope", REQUIRED),
                                    "causal": ("bool", True), "init": ("init", _GLOROT)})
def _attention(b, frame, x, heads, as_, causal, init):
    x = _float_tensor(b, x, "attention")
    if x.rank < 2 or heads < 1 or x.shape[-1] % heads:
        raise b.error("E-SHAPE-001", f"attention needs (... T D) with D divisible by :heads {heads}, "
                                     f"got {dims_text(x.shape)}.", b.e.loc)
    inner = _layer_frame(frame, as_)
    width = x.shape[-1]
    weights = [_weight(b, inner, name, (width, width), init, x) for name in ("wq", "wk", "wv", "wo")]
    with b.e.at(scope=inner.scope):
        q, k, v = (_split_heads(b, _times_transposed(b, x, w), heads) for w in weights[:3])
        mixed = b.emit("attention_core", q, k, v, scale=1.0 / math.sqrt(width // heads), causal=causal)
        return _times_transposed(b, _merge_heads(b, mixed), weights[3])


def _split_heads(b, x: Node, heads: int) -> Node:
    """(... T D) -> (... H T D/H)."""
    lead, (tokens, width) = x.shape[:-2], x.shape[-2:]
    split = b.emit("reshape", x, shape=lead + (tokens, heads, width // heads))
    n = len(lead)
    return b.emit("transpose", split, perm=tuple(range(n)) + (n + 1, n, n + 2))


def _merge_heads(b, x: Node) -> Node:
    """(... H T E) -> (... T H*E)."""
    lead, (heads, tokens, width) = x.shape[:-3], x.shape[-3:]
    n = len(lead)
    moved = b.emit("transpose", x, perm=tuple(range(n)) + (n + 1, n, n + 2))
    return b.emit("reshape", moved, shape=lead + (tokens, heads * width))


@builtin("dropout", ("value",), {"p": ("number", REQUIRED), "salt": ("salt", ())})
def _dropout(b, frame, x, p, salt):
    x = _float_tensor(b, x, "dropout")
    if not 0.0 <= p < 1.0:
        raise b.error("E-GRAPH-003", f"dropout :p must be at least 0 and less than 1, found {p}.", b.e.loc)
    if not b.training or p == 0.0:
        return x
    keep = b.draw(frame, "dropout", "bernoulli", x.shape, {"p": 1.0 - p}, salt, b.e.loc)
    kept = b.emit("mul", x, b.emit("cast", keep, dtype=x.dtype))
    return b.emit("div", kept, b.const(1.0 - p, like=x))


# --- convolution and pooling (NCHW) ---------------------------------------------------------------


def _image(b, x, what: str) -> Node:
    x = _float_tensor(b, x, what)
    if x.rank != 4:
        raise b.error("E-SHAPE-001", f"{what} needs images (N C H W), got {dims_text(x.shape)}.", b.e.loc)
    return x


@builtin("conv2d", ("value",), {"out": ("size", REQUIRED), "kernel": ("pair", REQUIRED), "as": ("scope", REQUIRED),
                                 "stride": ("pair", (1, 1)), "padding": ("pair", (0, 0)),
                                 "bias": ("bool", True), "init": ("init", _GLOROT)})
def _conv2d(b, frame, x, out, kernel, as_, stride, padding, bias, init):
    x = _image(b, x, "conv2d")
    if out < 1 or min(kernel) < 1:
        raise b.error("E-GRAPH-003", f"conv2d needs :out and :kernel of at least 1, got :out {out} and "
                                     f":kernel {dims_text(kernel)}.", b.e.loc)
    inner = _layer_frame(frame, as_)
    w = _weight(b, inner, "w", (out, x.shape[1]) + kernel, init, x)
    with b.e.at(scope=inner.scope):
        y = b.emit("conv2d", x, w, stride=stride, padding=padding)
        if bias:
            y = b.emit("add", y, b.emit("reshape", _weight(b, inner, "b", (out,), _ZEROS, x), shape=(out, 1, 1)))
    return y


def _pool(op: str, name: str):
    def build(b, frame, x, kernel, stride):
        return b.emit(op, _image(b, x, name), kernel=kernel, stride=stride or kernel)

    return build


builtin("max-pool", ("value",), {"kernel": ("pair", REQUIRED), "stride": ("pair", None)})(_pool("max_pool2d", "max-pool"))
builtin("avg-pool", ("value",), {"kernel": ("pair", REQUIRED), "stride": ("pair", None)})(_pool("avg_pool2d", "avg-pool"))


# --- draws ------------------------------------------------------------------------------------------

_SALT = ("salt", ())


def _draw(op_name: str, ir_op: str, checks):
    def build(b, frame, shape, salt, **params):
        problem = checks(params)
        if problem:
            raise b.error("E-GRAPH-003", f"({op_name} ...): {problem}", b.e.loc)
        return b.draw(frame, op_name, ir_op, shape, params, salt, b.e.loc)

    return build


builtin("normal", ("dims",), {"mean": ("number", 0.0), "std": ("number", 1.0), "salt": _SALT})(
    _draw("normal", "normal", lambda p: "a negative :std" if p["std"] < 0 else None))
builtin("uniform", ("dims",), {"low": ("number", 0.0), "high": ("number", 1.0), "salt": _SALT})(
    _draw("uniform", "uniform", lambda p: None if p["low"] < p["high"] else ":low must be less than :high"))
builtin("truncated-normal", ("dims",), {"mean": ("number", 0.0), "std": ("number", 1.0), "bound": ("number", 2.0),
                                         "salt": _SALT})(
    _draw("truncated-normal", "truncated_normal",
          lambda p: None if p["std"] >= 0 and p["bound"] >= 0.1 else ":std must be at least 0 and :bound at least 0.1"))
builtin("bernoulli", ("dims",), {"p": ("number", REQUIRED), "salt": _SALT})(
    _draw("bernoulli", "bernoulli", lambda p: None if 0 <= p["p"] <= 1 else ":p must be from 0 to 1"))
builtin("randint", ("dims",), {"low": ("int", REQUIRED), "high": ("int", REQUIRED), "salt": _SALT})(
    _draw("randint", "randint", lambda p: None if p["low"] < p["high"] else ":low must be less than :high"))
