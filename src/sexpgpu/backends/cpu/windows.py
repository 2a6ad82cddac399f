"""Convolution and pooling kernels of the interpreter, each sum in a fixed, documented order.

Layout and attributes are the op table's (graph/core/ops.py, "window"): values NCHW, weights
(O, C, KH, KW), stride and padding as (rows, columns). Below, xp is x with `padding` zeros
before and after each spatial axis, and the window of output position (y, x) starts at row
sh*y and column sw*x of xp; (a, b) is an offset inside a KH x KW window.

Orders. Each product is rounded before it is added (no fused multiply-add); "fold" is the
sequential left fold of folds.py, starting from its first term unless it says from +0:

- conv2d: out[n, o, y, x] = fold over (c, a, b) in C order of
  xp[n, c, sh*y + a, sw*x + b] * w[o, c, a, b]. Padded positions are terms like any other
  (+0 times the weight). Computed as folds.matmul of the weight (O, C*KH*KW) and the
  window columns (C*KH*KW, N*OH*OW).
- conv2d_weight_grad: dw[o, c, a, b] = fold over (n, y, x) in C order of
  g[n, o, y, x] * xp[n, c, sh*y + a, sw*x + b]; one folds.matmul.
- conv2d_input_grad: first, for every window column, t[c, a, b, n, y, x] = fold over o of
  w[o, c, a, b] * g[n, o, y, x] (one folds.matmul); then dx[n, c, i, j] = fold from +0 over
  the windows (y, x) that reach (i, j), in C order, of t[c, a, b, n, y, x] with (a, b) the
  offset of (i, j) in that window: sh*y + a = i + ph and sw*x + b = j + pw. What falls on
  padding is dropped.
- max_pool2d: the IEEE maximum of the window, which does not depend on order.
- avg_pool2d: fold over (a, b) in C order of the window, then one division by KH*KW.
- max_pool2d_grad: a window's first maximum is its first element in (a, b) C order that
  compares equal to the window's maximum (-0 equals +0), or its first NaN. dx[n, c, i, j] =
  fold from +0, over the windows (y, x) whose first maximum is (i, j), in C order, of
  g[n, c, y, x].
- avg_pool2d_grad: q = g / (KH*KW), one division per element; dx[n, c, i, j] = fold from +0
  over the windows (y, x) that reach (i, j), in C order, of q[n, c, y, x].

The three folds "over the windows that reach (i, j)" take one term per window offset, the
offsets in reverse C order: a larger offset (a, b) belongs to an earlier window. This is the
order of a gather that loops over an element's windows, as GPU kernels for these sums do.
- max_pool2d_pick: h at each window's first maximum; no arithmetic.

Vectorised across output elements: each step of a fold is one numpy operation over every
output element at once (folds.matmul also splits large ones across threads).
"""

from __future__ import annotations

import numpy as np

from sexpgpu.backends.cpu import folds


def offsets(kernel) -> list:
    """Every (a, b) of a window, in C order."""
    return [(a, b) for a in range(kernel[0]) for b in range(kernel[1])]


def _offsets_by_window(kernel) -> list:
    """(index in C order, (a, b)) of every offset, in the order that visits the windows
    reaching one element in C order: offsets in reverse C order."""
    return list(reversed(list(enumerate(offsets(kernel)))))


def at_offset(image: np.ndarray, offset, stride, counts) -> np.ndarray:
    """The view of `image` (N, C, H, W) holding offset (a, b) of every window: (N, C, OH, OW)."""
    (a, b), (sh, sw), (rows, cols) = offset, stride, counts
    return image[:, :, a : a + sh * rows : sh, b : b + sw * cols : sw]


def padded(x: np.ndarray, padding) -> np.ndarray:
    rows, cols = padding
    if rows == 0 and cols == 0:
        return x
    return np.pad(x, ((0, 0), (0, 0), (rows, rows), (cols, cols)))


def window_columns(xp: np.ndarray, kernel, stride, counts) -> np.ndarray:
    """The windows of xp as columns: (C*KH*KW, N*OH*OW), rows in (c, a, b) C order and
    columns in (n, y, x) C order."""
    batch, channels = xp.shape[:2]
    columns = np.empty((channels,) + tuple(kernel) + (batch,) + tuple(counts), xp.dtype)
    for a, b in offsets(kernel):
        columns[:, a, b] = at_offset(xp, (a, b), stride, counts).transpose(1, 0, 2, 3)
    return columns.reshape(channels * kernel[0] * kernel[1], -1)


def rows_by_channel(g: np.ndarray) -> np.ndarray:
    """g (N, O, OH, OW) as (O, N*OH*OW), columns in (n, y, x) C order."""
    return np.ascontiguousarray(g.transpose(1, 0, 2, 3)).reshape(g.shape[1], -1)


def _conv2d(node, args, m):
    x, w = args
    stride, padding = node.attrs["stride"], node.attrs["padding"]
    batch, out_channels, rows, cols = node.shape
    laid = window_columns(padded(x, padding), w.shape[2:], stride, (rows, cols))
    product = folds.matmul(w.reshape(out_channels, -1), laid)  # (O, N*OH*OW)
    return np.ascontiguousarray(product.reshape(out_channels, batch, rows, cols).transpose(1, 0, 2, 3))


def _conv2d_weight_grad(node, args, m):
    x, g = args
    stride, padding = node.attrs["stride"], node.attrs["padding"]
    kernel = node.shape[2:]
    laid = window_columns(padded(x, padding), kernel, stride, g.shape[2:])
    return folds.matmul(rows_by_channel(g), laid.T).reshape(node.shape)


def _conv2d_input_grad(node, args, m):
    g, w = args
    stride, (pad_rows, pad_cols) = node.attrs["stride"], node.attrs["padding"]
    batch, channels, height, width = node.shape
    kernel, counts = w.shape[2:], g.shape[2:]
    partial = folds.matmul(np.ascontiguousarray(w.reshape(w.shape[0], -1).T), rows_by_channel(g))
    partial = partial.reshape((channels, kernel[0] * kernel[1], batch) + tuple(counts))
    padded_shape = (batch, channels, height + 2 * pad_rows, width + 2 * pad_cols)
    dxp = _spread(lambda index: partial[:, index].transpose(1, 0, 2, 3), padded_shape, kernel, stride, counts, g.dtype)
    return np.ascontiguousarray(dxp[:, :, pad_rows : pad_rows + height, pad_cols : pad_cols + width])


def first_maxima(x: np.ndarray, kernel, stride, counts) -> np.ndarray:
    """For every window, the index in C order of its first maximum (or first NaN)."""
    window = offsets(kernel)
    best = at_offset(x, window[0], stride, counts).copy()
    where = np.zeros(best.shape, np.int32)
    for index, offset in enumerate(window[1:], start=1):
        value = at_offset(x, offset, stride, counts)
        better = (value > best) | (np.isnan(value) & ~np.isnan(best))
        np.copyto(best, value, where=better)
        where[better] = index
    return where


def _max_pool2d(node, args, m):
    (x,) = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    views = [at_offset(x, offset, stride, node.shape[2:]) for offset in offsets(kernel)]
    return folds.reduce_max(np.stack(views), (0,))


def _avg_pool2d(node, args, m):
    (x,) = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    window = offsets(kernel)
    total = at_offset(x, window[0], stride, node.shape[2:]).copy()
    for offset in window[1:]:
        np.add(total, at_offset(x, offset, stride, node.shape[2:]), out=total)
    return total / x.dtype.type(len(window))


def _spread(values_at, shape, kernel, stride, counts, dtype) -> np.ndarray:
    """dx from +0, adding values_at(index) at offset number `index` of every window, each
    element's windows in C order."""
    dx = np.zeros(shape, dtype)
    for index, offset in _offsets_by_window(kernel):
        target = at_offset(dx, offset, stride, counts)
        np.add(target, values_at(index), out=target)
    return dx


def _max_pool2d_grad(node, args, m):
    x, g = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    first = first_maxima(x, kernel, stride, g.shape[2:])
    zero = g.dtype.type(0)
    return _spread(lambda index: np.where(first == index, g, zero), x.shape, kernel, stride, g.shape[2:], g.dtype)


def _max_pool2d_pick(node, args, m):
    x, h = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    counts = node.shape[2:]
    first = first_maxima(x, kernel, stride, counts)
    picked = np.zeros(node.shape, h.dtype)
    for index, offset in enumerate(offsets(kernel)):
        np.copyto(picked, at_offset(h, offset, stride, counts), where=first == index)
    return picked


def _avg_pool2d_grad(node, args, m):
    (g,) = args
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    share = g / g.dtype.type(kernel[0] * kernel[1])
    return _spread(lambda index: share, node.shape, kernel, stride, g.shape[2:], g.dtype)


WINDOW_KERNELS = {
    "conv2d": _conv2d,
    "conv2d_input_grad": _conv2d_input_grad,
    "conv2d_weight_grad": _conv2d_weight_grad,
    "max_pool2d": _max_pool2d,
    "max_pool2d_grad": _max_pool2d_grad,
    "max_pool2d_pick": _max_pool2d_pick,
    "avg_pool2d": _avg_pool2d,
    "avg_pool2d_grad": _avg_pool2d_grad,
}
