"""Random graphs over every op of graph/core/ops.py, for comparing the CUDA backend with the CPU
interpreter: `graph_from_seed(seed, profile)` is a pure function of its arguments.

A graph applies a few ops, each to values made before it (inputs, or results of earlier ops)
or to fresh inputs of shapes that fit: axes of size 1, 0-d values, broadcasting, and in the
"gpu" profile odd and large sizes (rows longer than a row kernel's block, columns longer than
a column kernel's chunk, reductions long enough to be split). Its first op is
`OP_NAMES[seed % len(OP_NAMES)]`, so consecutive seeds cover every op. A graph is f32 or, one
time in five, bf16. When it has float inputs, `loss = sum(output * w)` over its float
outputs is differentiated with graph/autodiff, and the gradients are outputs too.

The backends agree only where the computation is continuous: the CUDA backend sums in
another order, so a value after a sum, a product or a normalisation differs by rounding.
The ops that jump (comparisons, argmax, casts to integers) are therefore applied to *exact*
values only: inputs, and elementwise ops and views of exact values (elementwise kernels give
the interpreter's bits). Domains are kept: log, sqrt, rsqrt, div and pow read
`x * x + 0.25`, exp reads `tanh x`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from attention_checks import float64_errors
from op_cases import random_array
from sexpgpu.graph.training.autodiff import gradients
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ir import FLOAT_DTYPES, Graph
from sexpgpu.graph.core.ops import OPS


class Profile(NamedTuple):
    name: str
    dims: tuple  # the sizes an axis may take
    max_elements: int  # of any one value
    max_rank: int
    max_ops: int  # ops applied after the first
    window_dims: tuple  # sizes of an image's axes
    matmul_inner: int  # the longest contracted axis
    bf16_windows: bool  # PyTorch's CPU bf16 convolution and pooling do not sum in float32 as cuDNN does


TINY = Profile("tiny", (1, 1, 2, 3, 4, 5), 64, 3, 2, (1, 2, 3, 4, 5), 8, False)
GPU = Profile("gpu", (1, 1, 2, 3, 5, 7, 16, 31, 64, 127, 257, 1000, 2049, 4097, 70001), 300_000, 4, 4,
              (1, 2, 3, 5, 8, 13), 1024, True)
PROFILES = {profile.name: profile for profile in (TINY, GPU)}


class RandomGraph(NamedTuple):
    seed: int
    graph: Graph
    values: dict  # input name -> host array
    ops: frozenset  # the op table's ops the graph's nodes use
    loose: bool  # bf16 somewhere: compare with the bf16 tolerance
    attended: frozenset = frozenset()  # the outputs computed from fused float32 attention


class Skip(Exception):
    """The op cannot be applied to the values at hand; the generator picks another."""


@dataclass
class _Value:
    node: object
    exact: bool  # computed without any sum: both backends hold the same bits


@dataclass
class _Builder:
    rng: np.random.Generator
    profile: Profile
    dtype: str
    e: Emitter = field(default_factory=Emitter)
    inputs: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    pool: list = field(default_factory=list)
    fresh_only: bool = False  # take no value of the pool: after many misfits

    # --- shapes -----------------------------------------------------------------------------

    def choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    def shape(self, low_rank: int = 0, high_rank: int | None = None) -> tuple:
        high = self.profile.max_rank if high_rank is None else high_rank
        rank = int(self.rng.integers(low_rank, high + 1))
        dims = [self.choice(self.profile.dims) for _ in range(rank)]
        while math.prod(dims) > self.profile.max_elements:
            largest = dims.index(max(dims))
            dims[largest] = self.choice([size for size in self.profile.dims if size < dims[largest]])
        return tuple(dims)

    def broadcast_partner(self, shape: tuple) -> tuple:
        """A shape that broadcasts with `shape` to `shape`: leading axes dropped, some axes 1."""
        drop = int(self.rng.integers(0, len(shape) + 1))
        return tuple(1 if self.rng.random() < 0.3 else size for size in shape[drop:])

    # --- values -----------------------------------------------------------------------------

    def fresh(self, dtype: str, shape: tuple, kind: str = "normal"):
        """A new input, of at most the profile's element count, to apply ops to."""
        if math.prod(shape) > self.profile.max_elements:
            raise Skip()
        return self.new_input(dtype, shape, kind)

    def new_input(self, dtype: str, shape: tuple, kind: str = "normal"):
        name = f"x{len(self.inputs)}"
        node = self.e.input(name, dtype, shape)
        self.inputs[name] = node
        self.values[name] = random_array(self.rng, dtype, shape, kind)
        self.pool.append(_Value(node, True))
        return node

    def operand(self, accept: Callable = lambda node: True, exact: bool = False, dtypes=None, make=None):
        """A value of the pool that `accept`s (and is exact, when asked), or a fresh input."""
        dtypes = dtypes or (self.dtype,)
        found = [value.node for value in self.pool
                 if value.node.dtype in dtypes and accept(value.node) and (value.exact or not exact)]
        if found and not self.fresh_only and self.rng.random() < 0.75:
            return self.choice(found)
        if make is None:
            raise Skip()
        return make()

    def float_operand(self, low_rank: int = 0, exact: bool = False):
        return self.operand(lambda node: node.rank >= low_rank, exact,
                            make=lambda: self.fresh(self.dtype, self.shape(low_rank)))

    def is_exact(self, node) -> bool:
        return any(value.node is node and value.exact for value in self.pool) or node.op in ("const", "input")

    def add(self, node, exact: bool):
        self.pool.append(_Value(node, exact))
        return node


# --- one generator per op ---------------------------------------------------------------------
# Each takes the builder, appends the op's node (and the nodes that feed it) and returns it.
# An elementwise result of exact operands is exact.


def _elementwise(b: _Builder, op: str, *inputs, **attrs):
    node = b.e(op, *inputs, **attrs)
    return b.add(node, all(b.is_exact(source) for source in inputs))


def _unary(op: str):
    def make(b: _Builder):
        return _elementwise(b, op, b.float_operand())

    return make


def _bounded(op: str):
    def make(b: _Builder):
        return _elementwise(b, op, _elementwise(b, "tanh", b.float_operand()))

    return make


def _positive(b: _Builder, x):
    """x * x + 0.25: inside the domain of log, sqrt and rsqrt, and far from a zero divisor."""
    return _elementwise(b, "add", _elementwise(b, "mul", x, x), b.e.const(0.25, like=x))


def _positive_unary(op: str):
    def make(b: _Builder):
        return _elementwise(b, op, _positive(b, b.float_operand()))

    return make


def _pair(b: _Builder, dtypes, exact: bool = False, kinds=None):
    """Two operands that broadcast together, in either order; fresh ones of the value kind
    `kinds[dtype]`."""
    kinds = {"i32": "labels:9", **(kinds or {})}
    x = b.operand(lambda node: True, exact, dtypes, make=lambda: b.fresh(dtypes[0], b.shape(), kinds.get(dtypes[0], "normal")))
    y = b.operand(lambda node: node.shape == x.shape or node.rank == 0, exact, (x.dtype,),
                  make=lambda: b.fresh(x.dtype, b.broadcast_partner(x.shape), kinds.get(x.dtype, "normal")))
    return (x, y) if b.rng.random() < 0.5 else (y, x)


def _binary(op: str, integer: bool = True):
    def make(b: _Builder):
        dtypes = (b.dtype, "i32") if integer and b.rng.random() < 0.2 else (b.dtype,)
        return _elementwise(b, op, *_pair(b, dtypes))

    return make


def _div(b: _Builder):
    x, y = _pair(b, (b.dtype,))
    return _elementwise(b, "div", x, _positive(b, y))


def _pow(b: _Builder):
    x, y = _pair(b, (b.dtype,))
    return _elementwise(b, "pow", _positive(b, x), _elementwise(b, "tanh", y))


def _compare(op: str):
    def make(b: _Builder):
        dtypes = ("i32", b.dtype) if b.rng.random() < 0.3 else (b.dtype,)
        return _elementwise(b, op, *_pair(b, dtypes, exact=True, kinds={"i32": "labels:3", b.dtype: "small"}))

    return make


def _where(b: _Builder):
    condition = _compare(b.choice(["lt", "ge", "eq"]))(b)
    a = b.operand(lambda node: node.shape == condition.shape, make=lambda: b.fresh(b.dtype, condition.shape))
    other = b.fresh(b.dtype, b.broadcast_partner(condition.shape))
    return _elementwise(b, "where", condition, a, other)


def _cast(b: _Builder):
    other = "bf16" if b.dtype == "f32" else "f32"
    route = b.choice(["float", "to_int", "from_int"])
    if route == "float":
        return _elementwise(b, "cast", b.float_operand(), dtype=other)
    if route == "to_int":
        x = b.operand(exact=True, make=lambda: b.fresh(b.dtype, b.shape(), "wide"))
        return _elementwise(b, "cast", x, dtype="i32")
    ids = b.operand(dtypes=("i32",), make=lambda: b.fresh("i32", b.shape(), "labels:9"))
    return _elementwise(b, "cast", ids, dtype=b.dtype)


def _const(b: _Builder):
    x = b.float_operand()
    value = b.e.const(float(b.choice([0.5, -2.0, 3.25])), like=x, shape=b.broadcast_partner(x.shape))
    return _elementwise(b, "add", x, value)


def _causal_mask(b: _Builder):
    size = b.choice([size for size in b.profile.dims if size <= 257])
    mask = b.e("causal_mask", size=size)
    x = b.fresh(b.dtype, b.shape(0, 1) + (size, size))
    return _elementwise(b, "where", mask, x, _elementwise(b, "neg", x))


def _axes(b: _Builder, rank: int) -> tuple:
    axes = tuple(axis for axis in range(rank) if b.rng.random() < 0.5)
    return axes or ((int(b.rng.integers(rank)),) if rank else ())


def _reduce(op: str):
    def make(b: _Builder):
        if b.rng.random() < 0.2:
            x = b.operand(dtypes=("i32",), make=lambda: b.fresh("i32", b.shape(), "labels:9"))
        else:
            x = b.float_operand()
        axes = None if b.rng.random() < 0.15 else _axes(b, x.rank)
        return b.add(b.e(op, x, axes=axes, keep=bool(b.rng.random() < 0.5)), x.dtype == "i32")

    return make


def _argmax(b: _Builder):
    x = b.operand(lambda node: node.rank >= 1, exact=True, make=lambda: b.fresh(b.dtype, b.shape(1), "spread"))
    return b.add(b.e("argmax", x, axis=int(b.rng.integers(x.rank))), True)


def _over_axis(op: str):
    def make(b: _Builder):
        x = b.float_operand(1)
        attrs = {"eps": 1e-5} if op == "layernorm" else {"axis": int(b.rng.integers(-x.rank, x.rank))}
        return b.add(b.e(op, x, **attrs), False)

    return make


def _cross_entropy(b: _Builder):
    logits = b.float_operand(1)
    labels = b.fresh("i32", logits.shape[:-1], f"labels:{logits.shape[-1]}")
    return b.add(b.e("cross_entropy", logits, labels), False)


def _gather(b: _Builder):
    table = b.float_operand(1)
    ids_shape = b.shape(0, 2)
    if math.prod(ids_shape) * (table.size // table.shape[0]) > b.profile.max_elements:
        raise Skip()
    ids = b.fresh("i32", ids_shape, f"labels:{table.shape[0]}")
    return b.add(b.e("gather", table, ids), b.is_exact(table))


def _scatter_add(b: _Builder):
    values = b.float_operand(1)
    lead = int(b.rng.integers(1, values.rank + 1))
    rows = b.choice([size for size in b.profile.dims if size <= 257])
    ids = b.fresh("i32", values.shape[:lead], f"labels:{rows}")
    return b.add(b.e("scatter_add", ids, values, rows=rows), False)


def _one_hot(b: _Builder):
    depth = b.choice([size for size in b.profile.dims if size <= 257])
    ids = b.operand(lambda node: node.size * depth <= b.profile.max_elements, dtypes=("i32",),
                    make=lambda: b.fresh("i32", b.shape(0, 2), f"labels:{depth}"))
    if ids.size * depth > b.profile.max_elements:
        raise Skip()
    return b.add(b.e("one_hot", ids, depth=depth, dtype=b.dtype), True)


def _factor(b: _Builder, size: int) -> tuple:
    """A random shape of `size` elements (with axes of size 1 thrown in)."""
    dims, rest = [], size
    for prime in (2, 3, 5, 7):
        while rest % prime == 0 and b.rng.random() < 0.5:
            dims.append(prime)
            rest //= prime
    dims.append(rest)
    dims += [1] * int(b.rng.integers(0, 2))
    order = b.rng.permutation(len(dims))
    shape = tuple(dims[index] for index in order)
    return () if size == 1 and b.rng.random() < 0.3 else shape


def _reshape(b: _Builder):
    x = b.float_operand()
    return b.add(b.e("reshape", x, shape=_factor(b, x.size)), b.is_exact(x))


def _transpose(b: _Builder):
    x = b.float_operand()
    perm = tuple(int(axis) for axis in b.rng.permutation(x.rank))
    return b.add(b.e("transpose", x, perm=perm), b.is_exact(x))


def _slice(b: _Builder):
    x = b.float_operand(1)
    axis = int(b.rng.integers(x.rank))
    start = int(b.rng.integers(0, x.shape[axis]))
    stop = int(b.rng.integers(start + 1, x.shape[axis] + 1))
    return b.add(b.e("slice", x, axis=axis, start=start, stop=stop), b.is_exact(x))


def _pad(b: _Builder):
    x = b.float_operand(1)
    before, after = (int(count) for count in b.rng.integers(0, 3, 2))
    return b.add(b.e("pad", x, axis=int(b.rng.integers(x.rank)), before=before, after=after), b.is_exact(x))


def _concat(b: _Builder):
    x = b.float_operand(1)
    axis = int(b.rng.integers(x.rank))
    others = [b.fresh(b.dtype, x.shape[:axis] + (b.choice(b.profile.dims[:6]),) + x.shape[axis + 1:])
              for _ in range(int(b.rng.integers(1, 3)))]
    parts = [x] + others
    order = b.rng.permutation(len(parts))
    return b.add(b.e("concat", *[parts[index] for index in order], axis=axis), b.is_exact(x))


def _broadcast(b: _Builder):
    x = b.float_operand()
    lead = b.shape(0, 1)
    shape = lead + tuple(b.choice(b.profile.dims[:8]) if size == 1 else size for size in x.shape)
    if math.prod(shape) > b.profile.max_elements:
        raise Skip()
    return b.add(b.e("broadcast", x, shape=shape), b.is_exact(x))


def _matmul(b: _Builder):
    inner = [size for size in b.profile.dims if size <= b.profile.matmul_inner]
    a = b.operand(lambda node: 2 <= node.rank <= 3 and node.shape[-1] <= b.profile.matmul_inner,
                  make=lambda: b.fresh(b.dtype, b.shape(0, 1) + (b.choice(inner), b.choice(inner))))
    rows = a.size // a.shape[-1]
    columns = b.choice([size for size in inner if rows * size <= b.profile.max_elements] or [1])
    batch = b.broadcast_partner(a.shape[:-2])
    if b.rng.random() < 0.3:  # a transposed weight, as `linear` reads its own
        stored = b.fresh(b.dtype, batch + (columns, a.shape[-1]))
        right = b.add(b.e("transpose", stored, perm=tuple(range(len(batch))) + (len(batch) + 1, len(batch))), True)
    else:
        right = b.fresh(b.dtype, batch + (a.shape[-1], columns))
    return b.add(b.e("matmul", a, right), False)


def _image_shape(b: _Builder, low: int = 1) -> tuple:
    sizes = [size for size in b.profile.window_dims if size >= low]
    return (b.choice(sizes[:3]), b.choice(sizes[:4]), b.choice(sizes), b.choice(sizes))


def _conv_geometry(b: _Builder, image: tuple, kernel: tuple) -> dict:
    padding = tuple(int(b.rng.integers(0, 2)) for _ in range(2))
    for size, k, pad in zip(image[2:], kernel, padding):
        if size + 2 * pad < k:
            raise Skip()
    return {"stride": tuple(int(b.rng.integers(1, 3)) for _ in range(2)), "padding": padding}


def _conv_parts(b: _Builder):
    x = b.operand(lambda node: node.rank == 4 and node.shape[1] <= 8 and max(node.shape[2:]) <= 17,
                  make=lambda: b.fresh(b.dtype, _image_shape(b)))
    kernel = tuple(int(b.rng.integers(1, 4)) for _ in range(2))
    geometry = _conv_geometry(b, x.shape, kernel)
    weight = (b.choice([1, 2, 3, 4]), x.shape[1]) + kernel
    return x, weight, geometry


def _conv2d(b: _Builder):
    x, weight, geometry = _conv_parts(b)
    return b.add(b.e("conv2d", x, b.fresh(b.dtype, weight), **geometry), False)


def _conv_result_shape(x_shape, weight, geometry) -> tuple:
    counts = tuple((size + 2 * pad - k) // step + 1 for size, k, step, pad in
                   zip(x_shape[2:], weight[2:], geometry["stride"], geometry["padding"]))
    return (x_shape[0], weight[0]) + counts


def _conv2d_input_grad(b: _Builder):
    x, weight, geometry = _conv_parts(b)
    g = b.fresh(b.dtype, _conv_result_shape(x.shape, weight, geometry))
    return b.add(b.e("conv2d_input_grad", g, b.fresh(b.dtype, weight), input_shape=x.shape, **geometry), False)


def _conv2d_weight_grad(b: _Builder):
    x, weight, geometry = _conv_parts(b)
    g = b.fresh(b.dtype, _conv_result_shape(x.shape, weight, geometry))
    return b.add(b.e("conv2d_weight_grad", x, g, weight_shape=weight, **geometry), False)


def _pool_parts(b: _Builder, exact: bool):
    x = b.operand(lambda node: node.rank == 4 and max(node.shape[2:]) <= 17, exact=exact,
                  make=lambda: b.fresh(b.dtype, _image_shape(b), "spread"))
    kernel = tuple(int(b.rng.integers(1, size + 1)) for size in x.shape[2:])
    kernel = tuple(min(k, 3) for k in kernel)
    stride = tuple(int(b.rng.integers(1, 3)) for _ in range(2))
    pooled = x.shape[:2] + tuple((size - k) // step + 1 for size, k, step in zip(x.shape[2:], kernel, stride))
    return x, {"kernel": kernel, "stride": stride}, pooled


def _pool(op: str):
    def make(b: _Builder):
        x, window, _ = _pool_parts(b, False)
        return b.add(b.e(op, x, **window), op == "max_pool2d" and b.is_exact(x))

    return make


def _max_pool2d_grad(b: _Builder):
    x, window, pooled = _pool_parts(b, True)  # the routing jumps: exact images only
    return b.add(b.e("max_pool2d_grad", x, b.fresh(b.dtype, pooled), **window), False)


def _max_pool2d_pick(b: _Builder):
    x, window, _ = _pool_parts(b, True)
    return b.add(b.e("max_pool2d_pick", x, b.fresh(b.dtype, x.shape), **window), False)


def _avg_pool2d_grad(b: _Builder):
    x, window, pooled = _pool_parts(b, False)
    return b.add(b.e("avg_pool2d_grad", b.fresh(b.dtype, pooled), input_shape=x.shape, **window), False)


def _attention_inputs(b: _Builder, count: int) -> tuple:
    """`count` fresh float32 inputs of q, k, v, o, g and the attributes; float32 in a bf16
    graph too, whose other ops then leave them alone (bf16 attention has its own envelope,
    tests/cuda/test_attention_interpret.py)."""
    sizes = [size for size in b.profile.dims if size <= b.profile.matmul_inner]
    lead = b.shape(0, 2)
    queries, keys, width, value_width = (b.choice(sizes) for _ in range(4))
    causal = bool(b.rng.random() < 0.5)
    keys = queries if causal else keys
    shapes = [lead + (queries, width), lead + (keys, width), lead + (keys, value_width)] + [lead + (queries, value_width)] * 2
    attrs = {"scale": float(b.rng.uniform(0.1, 1.0)), "causal": causal}
    return tuple(b.fresh("f32", shape) for shape in shapes[:count]), attrs


def _attention_core(b: _Builder):
    inputs, attrs = _attention_inputs(b, 3)
    return b.add(b.e("attention_core", *inputs, **attrs), False)


def _attention_cotangent(op: str):
    def make(b: _Builder):
        inputs, attrs = _attention_inputs(b, 5)
        return b.add(b.e(op, *inputs, **attrs), False)

    return make


_DRAW_PARAMS = {
    "normal": {"mean": 0.5, "std": 2.0},
    "uniform": {"low": -1.0, "high": 3.0},
    "truncated_normal": {"mean": 0.0, "std": 1.0, "bound": 2.0},
    "bernoulli": {"p": 0.3},
    "randint": {"low": 0, "high": 7},
}


def _draw(op: str):
    def make(b: _Builder):
        shape = b.shape()
        salt = b.fresh("i32", (), "labels:1000")
        drawn = b.e(op, salt, shape=shape, seed=int(b.rng.integers(2**32)), stream=f"random/{op}",
                    salts=("step",), **_DRAW_PARAMS[op])
        b.add(drawn, True)
        if drawn.dtype == "bool":
            x = b.fresh(b.dtype, shape)
            return _elementwise(b, "where", drawn, x, b.e.const(0.0, like=x))
        if drawn.dtype == "i32":
            return drawn
        return _elementwise(b, "cast", drawn, dtype=b.dtype) if b.dtype != "f32" else drawn

    return make


GENERATORS = {
    "input": lambda b: b.fresh(b.dtype, b.shape()),
    "const": _const,
    "causal_mask": _causal_mask,
    **{op: _draw(op) for op in _DRAW_PARAMS},
    **{op: _unary(op) for op in ("neg", "relu", "gelu", "tanh", "sigmoid", "square", "erf")},
    "exp": _bounded("exp"),
    **{op: _positive_unary(op) for op in ("log", "sqrt", "rsqrt")},
    "cast": _cast,
    **{op: _binary(op) for op in ("add", "sub", "mul", "maximum", "minimum")},
    "div": _div,
    "pow": _pow,
    **{op: _compare(op) for op in ("eq", "ne", "lt", "le", "gt", "ge")},
    "where": _where,
    "sum": _reduce("sum"),
    "max": _reduce("max"),
    "argmax": _argmax,
    **{op: _over_axis(op) for op in ("softmax", "log_softmax", "layernorm")},
    "cross_entropy": _cross_entropy,
    "gather": _gather,
    "scatter_add": _scatter_add,
    "one_hot": _one_hot,
    "reshape": _reshape,
    "transpose": _transpose,
    "slice": _slice,
    "pad": _pad,
    "concat": _concat,
    "broadcast": _broadcast,
    "matmul": _matmul,
    "conv2d": _conv2d,
    "conv2d_input_grad": _conv2d_input_grad,
    "conv2d_weight_grad": _conv2d_weight_grad,
    "max_pool2d": _pool("max_pool2d"),
    "avg_pool2d": _pool("avg_pool2d"),
    "max_pool2d_grad": _max_pool2d_grad,
    "max_pool2d_pick": _max_pool2d_pick,
    "avg_pool2d_grad": _avg_pool2d_grad,
    "attention_core": _attention_core,
    "attention_grad_q": _attention_cotangent("attention_grad_q"),
    "attention_grad_kv": _attention_cotangent("attention_grad_kv"),
}
OP_NAMES = tuple(sorted(name for name, op in OPS.items() if op.kind != "exact"))  # exact-only ops: tests/backends/test_exact_mode_ops.py
ATTEMPTS = 20


WINDOW_OPS = frozenset(name for name, definition in OPS.items() if definition.kind == "window")


def _apply(b: _Builder, op: str):
    """Apply `op`, retrying with other random choices when the values at hand do not fit,
    then on fresh inputs alone; an op that fits nothing gives a fresh input."""
    for fresh_only in (False, True):
        b.fresh_only = fresh_only
        for _ in range(ATTEMPTS):
            try:
                return GENERATORS[op](b)
            except Skip:
                continue
    b.fresh_only = False
    return GENERATORS["input"](b)


def _dtype(rng, profile: Profile, ops) -> str:
    """f32, or one time in five bf16 where the profile runs the graph's window ops in bf16."""
    bf16 = rng.random() < 0.2
    return "bf16" if bf16 and (profile.bf16_windows or not WINDOW_OPS & set(ops)) else "f32"


def graph_from_seed(seed: int, profile: str | Profile = "tiny") -> RandomGraph:
    """A random graph, its input values, and the ops it covers; the same for the same seed."""
    profile = PROFILES[profile] if isinstance(profile, str) else profile
    rng = np.random.default_rng([seed, 20261201])
    ops = [OP_NAMES[seed % len(OP_NAMES)]]
    ops += [OP_NAMES[int(index)] for index in rng.integers(0, len(OP_NAMES), int(rng.integers(0, profile.max_ops + 1)))]
    b = _Builder(rng, profile, _dtype(rng, profile, ops))
    results = [_apply(b, op) for op in ops]
    outputs = {f"y{index}": node for index, node in enumerate(results)}
    _differentiate(b, outputs)
    graph = b.e.graph(b.inputs, outputs)
    loose = any(node.dtype == "bf16" for node in graph.nodes)
    return RandomGraph(seed, graph, b.values, frozenset(graph.op_counts()), loose, _attended(graph))


FUSED_ATTENTION = frozenset({"attention_core", "attention_grad_q", "attention_grad_kv"})


def _attended(graph: Graph) -> frozenset:
    """The names of the outputs that are, or are computed from, a float32 attention op (the
    CUDA backend's fused 3xTF32 kernels; _as_close_to_float64 says why they are refereed apart)."""
    reached = set()
    for node in graph.nodes:  # topological: a node's inputs come before it
        if (node.op in FUSED_ATTENTION and node.dtype == "f32") or any(source in reached for source in node.inputs):
            reached.add(node)
    return frozenset(name for name, node in graph.outputs.items() if node in reached)


def _differentiate(b: _Builder, outputs: dict) -> None:
    """Add `loss = sum over float outputs of sum(output * w)` and the gradients of the float
    inputs it reads, when there are any."""
    floats = [node for node in outputs.values() if node.dtype in FLOAT_DTYPES]
    wrt = [node for node in b.inputs.values() if node.dtype in FLOAT_DTYPES]
    if not floats or not wrt:
        return
    loss = None
    for node in floats:
        weight = b.new_input(node.dtype, node.shape)
        term = b.e("sum", b.e("mul", node, weight), axes=None)
        term = term if term.dtype == "f32" else b.e("cast", term, dtype="f32")
        loss = term if loss is None else b.e("add", loss, term)
    names = [name for name, node in b.inputs.items() if node.dtype in FLOAT_DTYPES]
    outputs["loss"] = loss
    for name, grad in zip(names, gradients(b.e, loss, [b.inputs[name] for name in names])):
        outputs[f"grad/{name}"] = grad


# --- comparing two backends -------------------------------------------------------------------


class Outcome(NamedTuple):
    seed: int
    ops: frozenset
    dtype: str  # "bf16" when the graph holds bf16 values, else "f32"
    failures: tuple  # one message per output outside the tolerance, or for an error


def compare(backend, reference, sample: RandomGraph) -> Outcome:
    """Run `sample` on both and compare every output within the tolerances of
    tests/op_cases.py (the bf16 ones for a graph holding bf16 values)."""
    from op_cases import assert_matches

    failures, float64 = [], {}
    try:
        want = reference.run(sample.graph, sample.values)
        got = backend.run(sample.graph, sample.values)
        for name, value in want.items():
            dtype = "bf16" if sample.loose else sample.graph.outputs[name].dtype
            found = backend.to_host(got[name])
            try:
                assert_matches(name, found, value, dtype)
            except AssertionError as error:
                if not _as_close_to_float64(name, found, value, sample, float64):
                    failures.append(f"{name}: {' '.join(str(error).split())[:300]}")
    except Exception as error:  # an internal error of either backend is a finding too
        failures.append(f"error: {type(error).__name__}: {' '.join(str(error).split())[:300]}")
    return Outcome(sample.seed, sample.ops, "bf16" if sample.loose else "f32", tuple(failures))


REFEREE_FACTOR = 8  # how much farther from float64 than the interpreter's float32 a result may be


def _as_close_to_float64(name: str, found, want, sample: RandomGraph, float64: dict) -> bool:
    """The referee for an output outside the plain tolerance: a sum over many terms with
    cancellation (a graph's `loss`) has no tolerance relative to its result, since both
    backends round in their own orders. The float64 interpreter is then the oracle: the CUDA
    result passes when it is at most REFEREE_FACTOR times farther from the float64 value than
    the CPU interpreter's float32 result is, plus one float32 rounding of that value.

    An output computed from float32 attention may instead pass the fused attention's own
    envelope (tests/cuda/attention_checks.py, docs/cuda.md "Attention"), norm-wise: its
    error is not the interpreter's, element by element. The kernels' 3xTF32 products drop
    about 2^-22 of each term, which reach every dS of a row through D, so an element the
    interpreter gets almost exactly (a gradient of a near one-hot softmax row, where the terms
    of dS k cancel) takes the error of its row's larger elements. That error is bounded by the interpreter's
    largest, not by its own."""
    from sexpgpu.backends.cpu import Interpreter

    if want.dtype.kind not in "f" or sample.loose:  # bf16 rounding points are the interpreter's own
        return False
    if not float64:
        float64.update(Interpreter("f64").run(sample.graph, sample.values))
    exact = np.asarray(float64[name], dtype=np.float64)
    if name in sample.attended and float64_errors(found, want, exact).within:
        return True
    rounding = np.abs(exact) * 2.0**-24
    cpu_error = np.abs(want.astype(np.float64) - exact)
    gpu_error = np.abs(found.astype(np.float64) - exact)
    return bool(np.all(gpu_error <= REFEREE_FACTOR * (cpu_error + rounding)))


def run_seeds(seeds, profile: str, device: str = "cuda", deadline: float | None = None) -> list:
    """Outcomes of the graphs of `seeds` on a fresh CUDA backend (a process of its own on the
    GPU; device "cpu" runs it under Triton's interpreter, which the caller must have set),
    stopping before a graph begins after the wall-clock time `deadline` (time.time())."""
    import time

    from sexpgpu.backends.cpu import Interpreter
    from sexpgpu.backends.cuda.backend import CudaBackend

    backend, reference = CudaBackend(device=device), Interpreter()
    outcomes = []
    for seed in seeds:
        if deadline is not None and time.time() > deadline:
            break
        outcomes.append(compare(backend, reference, graph_from_seed(seed, profile)))
    return outcomes


def summary(outcomes, profile: str, seconds: float, asked: int | None = None) -> str:
    """The line to quote: graphs run, ops covered, mismatches."""
    covered = frozenset().union(*(outcome.ops for outcome in outcomes)) & frozenset(OP_NAMES)
    failed = [outcome for outcome in outcomes if outcome.failures]
    bf16 = sum(outcome.dtype == "bf16" for outcome in outcomes)
    of = f" of {asked}" if asked is not None and asked != len(outcomes) else ""
    lines = [f"random graphs ({profile}): {len(outcomes)}{of} graphs run ({bf16} with bf16), "
             f"{len(covered)} of {len(OP_NAMES)} ops covered, {len(failed)} mismatches, {seconds:.0f} s"]
    missing = sorted(frozenset(OP_NAMES) - covered)
    if missing:
        lines.append("  ops not covered: " + " ".join(missing))
    for outcome in failed[:20]:
        lines.append(f"  seed {outcome.seed}: " + "; ".join(outcome.failures)[:400])
    return "\n".join(lines)
