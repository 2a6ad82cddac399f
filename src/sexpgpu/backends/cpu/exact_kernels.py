"""The interpreter's kernels under `:arithmetic exact`: every sum exact, rounded once.

Each op that sums (docs/determinism.md, "Exact runs") calls sexpgpu.exact on torch CPU
tensors: products are formed exactly and added as integers, and each output is rounded
once, to nearest even, into its node's dtype. Exact results are unique, so any backend
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

Gradient region (graph/exact_region.py): the nodes between a parameter's batch sums and its
`grad/` output return `Accumulator`s, unrounded; the run loop combines and rounds them.

A product that meets a padding zero is not formed, so an infinite weight gives no NaN at a
padded position; but a `0 * inf` product inside a sum is NaN, as in IEEE arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sexpgpu.backends.cpu import folds
from sexpgpu.backends.cpu.conv import at_offset, first_maxima, offsets, padded, rows_by_channel, window_columns
from sexpgpu.backends.cpu.op_kernels import KERNELS, check_ids
from sexpgpu.errors import SexpgpuError
from sexpgpu.exact import Accumulator, det_combine, det_finalize, det_gemm, det_gemm_partial, det_sum_partial
from sexpgpu.exact.layout import WIDTH

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


# --- between numpy and the exact library ------------------------------------------------------


def _tensor(array) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def _rounded(acc: Accumulator, node, shape=None) -> np.ndarray:
    """Each exact sum rounded once into the node's dtype, as the interpreter stores it;
    shaped as the node's result unless `shape` says otherwise."""
    value = det_finalize(_shaped(acc, node.shape if shape is None else shape), TORCH_DTYPES[node.dtype])
    return value.to(torch.float32).numpy()


def _shaped(acc: Accumulator, shape) -> Accumulator:
    return Accumulator(acc.digits.reshape(WIDTH, *shape))


def _summed(x: np.ndarray, axes) -> Accumulator:
    """The exact sum of x over `axes`, shaped like x without them."""
    rest = [axis for axis in range(x.ndim) if axis not in axes]
    moved = _tensor(x).permute(*rest, *axes)
    return det_sum_partial(moved.reshape(*[x.shape[axis] for axis in rest], -1), -1)


def _exact_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """The exact sum along `axis`, rounded once to float32, keeping the axis."""
    total = _summed(x, (axis % x.ndim,)).digits
    return det_finalize(Accumulator(total)).numpy().reshape(_kept(x.shape, axis))


def _kept(shape, axis: int) -> tuple:
    return tuple(1 if index == axis % len(shape) else dim for index, dim in enumerate(shape))


# --- products ---------------------------------------------------------------------------------


def _product_planes(a: np.ndarray, b: np.ndarray, shape) -> Accumulator:
    """The exact (..., M, K) x (..., K, N), leading dims broadcast, as an accumulator."""
    left, right = _tensor(a), _tensor(b)
    if right.dim() == 2:  # one matrix for the whole batch: the batch rows are more rows
        flat = det_gemm_partial(left.reshape(-1, left.shape[-1]), right.T.contiguous())
        return _shaped(flat, shape)
    batch = shape[:-2]
    left = left.broadcast_to(*batch, *left.shape[-2:]).reshape(-1, *left.shape[-2:])
    right = right.broadcast_to(*batch, *right.shape[-2:]).reshape(-1, *right.shape[-2:])
    parts = [det_gemm_partial(x, w.T.contiguous()).digits for x, w in zip(left, right)]
    return _shaped(Accumulator(torch.stack(parts, 1)), shape)


def _matmul(node, args, m):
    a, b = args
    if node.dtype == "f32" and b.ndim == 2:  # the fast path rounds from the top slices: same bits
        flat = det_gemm(_tensor(a).reshape(-1, a.shape[-1]), _tensor(b).T.contiguous())
        return flat.numpy().reshape(node.shape)
    return _rounded(_product_planes(a, b, node.shape), node)


# --- reductions and normalisations ------------------------------------------------------------


def _sum(node, args, m):
    return _rounded(_summed(args[0], node.attrs["axes"]), node)


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


# --- embeddings -------------------------------------------------------------------------------


def _scatter_planes(node, args) -> Accumulator:
    """Each row's exact sum of the value rows whose id names it: the rows of each id laid
    side by side (padded with zeros, which add nothing) and summed in one call."""
    ids, values = args
    rows = node.attrs["rows"]
    check_ids(ids, rows, "embedding id", node)
    flat_ids = ids.reshape(-1)
    width = math.prod(values.shape[ids.ndim:])
    digits = torch.zeros((WIDTH, rows, width), dtype=torch.int64)
    if flat_ids.size:
        order = np.argsort(flat_ids, kind="stable")
        named, starts, counts = np.unique(flat_ids[order], return_index=True, return_counts=True)
        laid = np.zeros((named.size, int(counts.max()), width), np.float32)
        laid[np.repeat(np.arange(named.size), counts), np.arange(flat_ids.size) - np.repeat(starts, counts)] = \
            values.reshape(-1, width)[order]
        digits[:, torch.from_numpy(named.astype(np.int64))] = det_sum_partial(_tensor(laid), 1).digits
    return _shaped(Accumulator(digits), node.shape)


def _scatter_add(node, args, m):
    return _rounded(_scatter_planes(node, args), node)


# --- windows ----------------------------------------------------------------------------------


def _conv2d(node, args, m):
    x, w = args
    batch, out_channels, rows, cols = node.shape
    laid = window_columns(padded(x, node.attrs["padding"]), w.shape[2:], node.attrs["stride"], (rows, cols))
    product = _product_planes(w.reshape(out_channels, -1), laid, (out_channels, batch, rows, cols))
    return np.ascontiguousarray(_rounded(product, node, product.shape).transpose(1, 0, 2, 3))


def _weight_grad_planes(node, args) -> Accumulator:
    x, g = args
    laid = window_columns(padded(x, node.attrs["padding"]), node.shape[2:], node.attrs["stride"], g.shape[2:])
    return _shaped(_product_planes(rows_by_channel(g), np.ascontiguousarray(laid.T), (node.shape[0], laid.shape[0])),
                   node.shape)


def _conv2d_weight_grad(node, args, m):
    return _rounded(_weight_grad_planes(node, args), node)


def _spread_planes(parts, padded_shape, kernel, stride, counts) -> Accumulator:
    """The exact sum, at every element of a padded image, of the accumulators parts[index]
    (N, C, OH, OW) placed at window offset `index`: one accumulator per offset, combined."""
    placed = []
    for index, offset in enumerate(offsets(kernel)):
        digits = torch.zeros((WIDTH, *padded_shape), dtype=torch.int64)
        view = at_offset(digits.permute(1, 2, 3, 4, 0), offset, stride, counts)  # (N, C, OH, OW, WIDTH)
        view.copy_(parts[index].digits.permute(1, 2, 3, 4, 0))
        placed.append(Accumulator(digits))
    return det_combine(placed)


def _conv2d_input_grad(node, args, m):
    g, w = args
    stride, (pad_rows, pad_cols) = node.attrs["stride"], node.attrs["padding"]
    batch, channels, height, width = node.shape
    kernel, counts = w.shape[2:], g.shape[2:]
    g_rows = _tensor(rows_by_channel(g)).T.contiguous()  # (N*OH*OW, O)
    parts = []
    for a, b in offsets(kernel):
        acc = det_gemm_partial(_tensor(w[:, :, a, b]).T.contiguous(), g_rows)  # (C, N*OH*OW)
        parts.append(Accumulator(acc.digits.reshape(WIDTH, channels, batch, *counts).transpose(1, 2)))
    shape = (batch, channels, height + 2 * pad_rows, width + 2 * pad_cols)
    total = _spread_planes(parts, shape, kernel, stride, counts).digits
    cropped = total[:, :, :, pad_rows : pad_rows + height, pad_cols : pad_cols + width].contiguous()
    return _rounded(Accumulator(cropped), node)


def _avg_pool2d(node, args, m):
    (x,) = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    views = np.stack([at_offset(x, offset, stride, node.shape[2:]) for offset in offsets(kernel)], -1)
    return _exact_sum(views, -1)[..., 0] / x.dtype.type(len(offsets(kernel)))


def _spread_values(values_at, node, kernel, stride, counts) -> np.ndarray:
    """Each element's exact sum of values_at(index) over the windows reaching it."""
    parts = [det_sum_partial(_tensor(values_at(index))[..., None], -1) for index in range(len(offsets(kernel)))]
    return _rounded(_spread_planes(parts, node.shape, kernel, stride, counts), node)


def _avg_pool2d_grad(node, args, m):
    (g,) = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    share = g / g.dtype.type(kernel[0] * kernel[1])
    return _spread_values(lambda index: share, node, kernel, stride, g.shape[2:])


def _max_pool2d_grad(node, args, m):
    x, g = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    first = first_maxima(x, kernel, stride, g.shape[2:])
    zero = g.dtype.type(0)
    return _spread_values(lambda index: np.where(first == index, g, zero), node, kernel, stride, g.shape[2:])


# --- the gradient region: accumulators in, accumulators out ----------------------------------


def _carry_add(node, args, m):
    return det_combine([Accumulator(acc.digits.broadcast_to(WIDTH, *node.shape).contiguous()) for acc in args])


def _carry_transpose(node, args, m):
    return Accumulator(args[0].digits.permute(0, *[axis + 1 for axis in node.attrs["perm"]]).contiguous())


def _const_planes(node, args, m):
    value = torch.full((*node.shape, 1), node.attrs["value"], dtype=torch.float32)
    return det_sum_partial(value, -1)


REGION_KERNELS = {
    "matmul": lambda node, args, m: _product_planes(*args, node.shape),
    "sum": lambda node, args, m: _shaped(_summed(args[0], node.attrs["axes"]), node.shape),
    "scatter_add": lambda node, args, m: _scatter_planes(node, args),
    "conv2d_weight_grad": lambda node, args, m: _weight_grad_planes(node, args),
    "add": _carry_add,
    "reshape": lambda node, args, m: _shaped(args[0], node.shape),
    "transpose": _carry_transpose,
    "const": _const_planes,
}

EXACT_KERNELS = {
    "matmul": _matmul,
    "sum": _sum,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "layernorm": _layernorm,
    "cross_entropy": _cross_entropy,
    "scatter_add": _scatter_add,
    "conv2d": _conv2d,
    "conv2d_weight_grad": _conv2d_weight_grad,
    "conv2d_input_grad": _conv2d_input_grad,
    "avg_pool2d": _avg_pool2d,
    "avg_pool2d_grad": _avg_pool2d_grad,
    "max_pool2d_grad": _max_pool2d_grad,
}

# Ops that sum but have no exact kernel here: a float32 attention op is written out as its
# composition first (graph/attention_parts.py); a bf16 one keeps its op and is refused.
UNSUPPORTED = ("attention_core", "attention_grad_q", "attention_grad_kv")


def exact_kernel(node, m, role: str | None):
    """`run(args) -> value` for one node of an exact graph; `role` is its place in the
    gradient region (graph/exact_region.py), or None outside it."""
    if node.op in UNSUPPORTED:
        raise SexpgpuError("E-EXACT-003", f"the CPU interpreter has no exact kernel for the bf16 op '{node.op}': "
                           ":arithmetic exact computes attention in float32.", node.loc)
    table = REGION_KERNELS if role is not None else EXACT_KERNELS
    kernel = table.get(node.op) or KERNELS[node.op]
    return lambda args: kernel(node, args, m)
