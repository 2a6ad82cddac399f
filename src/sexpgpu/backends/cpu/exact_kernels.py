"""The interpreter's kernels under `:arithmetic exact`: every sum exact, rounded once.

Each op that sums (docs/determinism.md, "Exact runs") calls backends/exact_ops.py, the
exact sums any backend computes, on torch CPU tensors: products are formed exactly and
added as integers, and each output is rounded once, to nearest even, into its node's dtype. Exact results are unique, so any backend
calling the same functions gives the same bits. What is not a sum keeps the interpreter's
float kernels (op_kernels.py): elementwise ops are the portable, correctly rounded math,
maxima do not depend on order.

The rules where an op is more than one sum (each sum exact, each rounded once):
- mean (a `sum` node, then a `div`): round(exact sum) / n, one IEEE division;
- softmax: e = exp(x - max), e / round(exact sum of e); log_softmax: s - log(round(exact sum of exp s));
- layernorm: mean = round(exact sum of x) / D, c = x - mean, var = round(exact sum of c * c) / D
  (each c * c rounded first: an elementwise product), y = c * rsqrt(var + eps);
- cross_entropy: minus the picked element of that log_softmax;
- avg_pool2d: round(exact sum of the window) / (KH * KW);
- conv2d_input_grad, avg_pool2d_grad, max_pool2d_grad: each element's sum over its windows
  is one exact sum of the exact per-window terms.

Acc values (graph/passes/exact_region.py: a gradient region's nodes, and what `round` reads)
are `Accumulator`s, unrounded; `round` rounds each sum once.

A window's padding zeros are terms of its sums, as in the float kernels (conv.py): a `0 * inf`
product is NaN, as in IEEE arithmetic.
"""

from __future__ import annotations

import numpy as np
import torch

from sexpgpu.backends import exact_ops as ops
from sexpgpu.backends.cpu import folds
from sexpgpu.backends.cpu.windows import first_maxima
from sexpgpu.backends.cpu.op_kernels import KERNELS, check_ids
from sexpgpu.backends.exact_sums import accumulated, rounded_once
from sexpgpu.errors import SexpgpuError
from sexpgpu.exact import det_finalize
from sexpgpu.graph.core.ops import EXACT_ONLY, OPS
from sexpgpu.graph.core.rules import RuleTable
from sexpgpu.graph.passes.exact_region import EXACT_FORMS, ROLES, on_acc


# --- between numpy and torch ------------------------------------------------------------------


def _tensor(array) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def _rounded(acc, node, shape=None) -> np.ndarray:
    """Each exact sum rounded once into the node's dtype, stored as the interpreter stores it
    (bf16 values in float32 arrays); shaped as the node's result unless `shape` says otherwise."""
    return ops.rounded(acc, node.shape if shape is None else shape, node.dtype).to(torch.float32).numpy()


def _exact_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """The exact sum along `axis`, rounded once to float32, keeping the axis."""
    axis %= x.ndim
    total = det_finalize(ops.summed(_tensor(x), (axis,))).numpy()
    return total.reshape(tuple(1 if index == axis else dim for index, dim in enumerate(x.shape)))


def _ids(ids: np.ndarray, bound: int, node) -> torch.Tensor:
    check_ids(ids, bound, "embedding id", node)
    return torch.from_numpy(ids.astype(np.int64))


# --- products and reductions ------------------------------------------------------------------


def _matmul(node, args, m):
    a, b = (_tensor(arg) for arg in args)
    return ops.rounded_product(a, b, node.shape, node.dtype).to(torch.float32).numpy()


def _sum(node, args, m):
    if node.inputs[0].dtype in ("i32", "bool"):  # integers add exactly in any order: the float kernel's fold
        return KERNELS["sum"](node, args, m)
    return _rounded(ops.summed(_tensor(args[0]), node.attrs["axes"]), node)


def _softmax(node, args, m):
    (x,) = args
    axis = node.attrs["axis"]
    exps = m.exp(x - folds.reduce_max(x, (axis,), keep=True))
    return exps / _exact_sum(exps, axis)


def _log_softmax_over(x: np.ndarray, axis: int, m) -> np.ndarray:
    shifted = x - folds.reduce_max(x, (axis,), keep=True)
    return shifted - m.log(_exact_sum(m.exp(shifted), axis))


def _log_softmax(node, args, m):
    return _log_softmax_over(args[0], node.attrs["axis"], m)


def _layernorm(node, args, m):
    (x,) = args
    count = x.dtype.type(x.shape[-1])
    centered = x - _exact_sum(x, -1) / count
    var = _exact_sum(centered * centered, -1) / count
    return centered * m.rsqrt(var + x.dtype.type(node.attrs["eps"]))


def _cross_entropy(node, args, m):
    logits, labels = args
    check_ids(labels, logits.shape[-1], "cross-entropy label", node)
    picked = np.take_along_axis(_log_softmax_over(logits, -1, m), labels[..., None].astype(np.intp), -1)
    return -picked[..., 0]


def _scatter_planes(node, args, m):
    ids, values = args
    return ops.scattered(_ids(ids, node.attrs["rows"], node), _tensor(values), node.attrs["rows"], node.shape)


# --- windows ----------------------------------------------------------------------------------


def _geometry(node) -> tuple:
    return node.attrs["stride"], node.attrs["padding"]


def _convolution(accumulate):
    """kernel(node, args, m) -> the digits of accumulate(*the two inputs, stride, padding, shape)."""
    return lambda node, args, m: accumulate(*(_tensor(arg) for arg in args), *_geometry(node), node.shape)


def _rounding(kernel):
    """kernel's exact sums rounded once into the node's dtype."""
    return lambda node, args, m: _rounded(kernel(node, args, m), node)


def _avg_pool2d(node, args, m):
    (x,) = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    total = ops.rounded(ops.window_sums(_tensor(x), kernel, stride, node.shape[2:]), node.shape, "f32").numpy()
    return total / x.dtype.type(kernel[0] * kernel[1])  # in float32, as the float kernel; a bf16 node rounds after


def _avg_pool2d_grad(node, args, m):
    (g,) = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    share = _tensor(g / g.dtype.type(kernel[0] * kernel[1]))
    return _rounded(ops.spread_values(lambda index: share, node.shape, kernel, stride, g.shape[2:]), node)


def _max_pool2d_grad(node, args, m):
    x, g = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    first = first_maxima(x, kernel, stride, g.shape[2:])
    zero = g.dtype.type(0)

    def given_at(index):  # what each window gives the element at its offset `index`
        return _tensor(np.where(first == index, g, zero))

    return _rounded(ops.spread_values(given_at, node.shape, kernel, stride, g.shape[2:]), node)


# --- the tables -------------------------------------------------------------------------------

# acc in or out (graph/passes/exact_region.py): the gradient region's unrounded sums
ACC_KERNELS = RuleTable("cpu acc kernels", needs=lambda op: op.name in ROLES + EXACT_ONLY)
ACC_KERNELS.add("matmul", lambda node, args, m: ops.product(_tensor(args[0]), _tensor(args[1]), node.shape))
ACC_KERNELS.add("sum", lambda node, args, m: ops.shaped(ops.summed(_tensor(args[0]), node.attrs["axes"]), node.shape))
ACC_KERNELS.add("scatter_add", _scatter_planes)
ACC_KERNELS.add("conv2d_weight_grad", _convolution(ops.conv2d_weight_grad))
ACC_KERNELS.add("add", lambda node, args, m: ops.added([accumulated(arg) for arg in args], node.shape))
ACC_KERNELS.add("reshape", lambda node, args, m: ops.shaped(accumulated(args[0]), node.shape))
ACC_KERNELS.add("transpose", lambda node, args, m: ops.transposed(accumulated(args[0]), node.attrs["perm"]))
ACC_KERNELS.add("const", lambda node, args, m: ops.constant(node.attrs["value"], node.shape, "cpu"))
ACC_KERNELS.add("round", lambda node, args, m: rounded_once(args[0], node.dtype).to(torch.float32).numpy())

# ops whose float kernel is already their exact rule: maxima take no order, gathers copy
FLOAT_IS_EXACT = ("max", "gather", "max_pool2d", "max_pool2d_pick")
EXACT_KERNELS = RuleTable("cpu exact kernels",
                          needs=lambda op: op.name in EXACT_FORMS and op.name not in FLOAT_IS_EXACT and op.kind != "attention")
for _op, _kernel in {
    "matmul": _matmul,
    "sum": _sum,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "layernorm": _layernorm,
    "cross_entropy": _cross_entropy,
    "scatter_add": _rounding(_scatter_planes),
    "conv2d": _rounding(_convolution(ops.conv2d)),
    "conv2d_weight_grad": _rounding(_convolution(ops.conv2d_weight_grad)),
    "conv2d_input_grad": _rounding(_convolution(ops.conv2d_input_grad)),
    "avg_pool2d": _avg_pool2d,
    "avg_pool2d_grad": _avg_pool2d_grad,
    "max_pool2d_grad": _max_pool2d_grad,
}.items():
    EXACT_KERNELS.add(_op, _kernel)


def exact_kernel(node, m):
    """`run(args) -> value` for a node of dtype acc, reading acc, or marked exact."""
    if OPS[node.op].kind == "attention":  # a float32 one was written out as its composition (graph/passes/decomposed.py)
        raise SexpgpuError("E-EXACT-003", f"the CPU interpreter has no exact kernel for the bf16 op '{node.op}': "
                           ":arithmetic exact computes attention in float32.", node.loc)
    kernel = (ACC_KERNELS if on_acc(node) else EXACT_KERNELS).get(node.op) or KERNELS[node.op]
    return lambda args: kernel(node, args, m)
