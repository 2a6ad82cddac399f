"""Exact sums on torch tensors of any device: what a backend computes under `:arithmetic exact`.

Each function forms its sums with sexpgpu.exact and returns them unrounded, as an
`Accumulator` shaped like the op's result; `rounded` rounds one once into a dtype. The CPU
interpreter calls these on CPU tensors (backends/cpu/exact_kernels.py); a device backend
calls the same functions on its own tensors, so the digits, and every bit rounded from
them, are the same on both. The layout follows the op table (graph/core/ops.py): images NCHW,
weights (O, C, KH, KW), stride and padding as (rows, columns).

Padding is never multiplied: a window's padded positions are zeros of the laid-out
operand, and a product with a zero adds nothing unless the other factor is infinite or NaN,
which the exact library counts as a NaN product (as IEEE arithmetic would).
"""

from __future__ import annotations

import torch

from sexpgpu.backends.spans import byte_span, spans_meet
from sexpgpu.exact import queued
from sexpgpu.exact import (Accumulator, det_combine, det_finalize, det_gemm, det_gemm_batched, det_gemm_partial,
                           det_scatter_sum, det_scatter_sum_partial, det_sum, det_sum_partial)
from sexpgpu.exact.layout import WIDTH

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def shaped(acc: Accumulator, shape) -> Accumulator:
    return Accumulator(acc.digits.reshape(WIDTH, *shape))


def rounded(acc: Accumulator, shape, dtype: str) -> torch.Tensor:
    """Each exact sum rounded once, to nearest even, into `dtype` ("f32" or "bf16")."""
    return det_finalize(shaped(acc, shape), TORCH_DTYPES[dtype])


def _summed_last(x: torch.Tensor, axes) -> torch.Tensor:
    """x with `axes` moved last and flattened into one: the terms of each sum along -1."""
    rest = [axis for axis in range(x.dim()) if axis not in axes]
    moved = x.permute(*rest, *axes) if x.dim() else x  # a scalar is the one term of its sum
    return moved.reshape(*[x.shape[axis] for axis in rest], -1)


def summed(x: torch.Tensor, axes) -> Accumulator:
    """The exact sum of x over `axes`, shaped like x without them."""
    return det_sum_partial(_summed_last(x, axes), -1)


def rounded_sum(x: torch.Tensor, axes, shape, dtype: str) -> torch.Tensor:
    """summed(x, axes) rounded once into `dtype` and shaped `shape`, by det_sum's fast paths,
    which round from bounds to the same bits, for any number of terms (a gradient norm sums
    every parameter's), and wait for no device count on CUDA."""
    return det_sum(_summed_last(x, axes), -1, dtype=TORCH_DTYPES[dtype]).reshape(shape)


def _matrices(a: torch.Tensor, b: torch.Tensor, shape) -> tuple:
    """(x (B, M, K), w (B, N, K)): the product's matrices, the batch axes broadcast to
    `shape`'s and flattened, each right matrix transposed (x[i] @ w[i].T is output i)."""
    batch = tuple(shape[:-2])
    left = a.broadcast_to(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    right = b.broadcast_to(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return left, right.transpose(1, 2)


def product(a: torch.Tensor, b: torch.Tensor, shape) -> Accumulator:
    """The exact (..., M, K) x (..., K, N), leading dims broadcast to `shape`'s."""
    if b.dim() == 2:  # one matrix for the whole batch: the batch rows are more rows
        return shaped(det_gemm_partial(a.reshape(-1, a.shape[-1]), b.T.contiguous()), shape)
    parts = [det_gemm_partial(x, w.contiguous()).digits for x, w in zip(*_matrices(a, b, shape))]
    return shaped(Accumulator(torch.stack(parts, 1)), shape)


def rounded_product(a: torch.Tensor, b: torch.Tensor, shape, dtype: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """product(a, b, shape) rounded once, by the fast paths, which round from bounds or the top
    slices to the same bits: det_gemm for a float32 product by one matrix (on CUDA with no
    wait for the device), det_gemm_batched (all the matrices at once) for any other. out: a
    buffer the result may be written into, which it is (and returned) where the queued path
    takes the product and out is contiguous float32 apart from the operands' memory."""
    x, w = (a.reshape(-1, a.shape[-1]), b.T) if b.dim() == 2 else _matrices(a, b, shape)
    if out is not None and dtype == "f32" and _writable(out, x, w):
        return queued.queued_product(x, w, out)
    if dtype == "f32" and x.dim() == 2:
        return det_gemm(x, w, non_blocking=True).reshape(shape)
    x, w = (x[None], w[None]) if x.dim() == 2 else (x, w)
    return det_gemm_batched(x, w, TORCH_DTYPES[dtype]).reshape(shape)  # strided: read as they lie


def _writable(out: torch.Tensor, *operands: torch.Tensor) -> bool:
    """Whether the queued path may write a float32 product straight into `out`: it takes the
    product, and out is contiguous float32 whose memory no operand reaches (the refine stages
    read the operands after the first values are written)."""
    if not queued.applies(out.device, torch.float32) or out.dtype != torch.float32 or not out.is_contiguous():
        return False
    if any(t.device != out.device or t.dtype not in (torch.float32, torch.bfloat16) for t in operands):
        return False
    return not any(spans_meet(byte_span(out), byte_span(t)) for t in operands)


def scattered(ids: torch.Tensor, values: torch.Tensor, rows: int, shape) -> Accumulator:
    """Row r is the exact sum of the value rows whose id is r (ids already checked)."""
    return shaped(det_scatter_sum_partial(ids, values, rows), shape)


def rounded_scatter(ids: torch.Tensor, values: torch.Tensor, rows: int, shape, dtype: str) -> torch.Tensor:
    """scattered rounded once into `dtype`; on CUDA in one kernel that waits for no count."""
    return det_scatter_sum(ids, values, rows, TORCH_DTYPES[dtype]).reshape(shape)


# --- windows ----------------------------------------------------------------------------------


def offsets(kernel) -> list:
    """Every (a, b) of a window, in C order."""
    return [(a, b) for a in range(kernel[0]) for b in range(kernel[1])]


def at_offset(image, offset, stride, counts):
    """The view of `image` (N, C, H, W, ...) holding offset (a, b) of every window: (N, C, OH, OW, ...)."""
    (a, b), (sh, sw), (rows, cols) = offset, stride, counts
    return image[:, :, a : a + sh * rows : sh, b : b + sw * cols : sw]


def _padded(x: torch.Tensor, padding) -> torch.Tensor:
    rows, cols = padding
    return torch.nn.functional.pad(x, (cols, cols, rows, rows)) if rows or cols else x


def _window_columns(x: torch.Tensor, kernel, stride, padding, counts) -> torch.Tensor:
    """The windows of the padded x as rows: (N*OH*OW, C*KH*KW), in (n, y, x) and (c, a, b) C order."""
    xp = _padded(x, padding)
    views = [at_offset(xp, offset, stride, counts) for offset in offsets(kernel)]  # each (N, C, OH, OW)
    laid = torch.stack(views, -1)  # (N, C, OH, OW, KH*KW)
    return laid.permute(0, 2, 3, 1, 4).reshape(-1, x.shape[1] * len(views))


def _by_channel(g: torch.Tensor) -> torch.Tensor:
    """g (N, O, OH, OW) as (N*OH*OW, O)."""
    return g.permute(0, 2, 3, 1).reshape(-1, g.shape[1])


def conv2d(x: torch.Tensor, w: torch.Tensor, stride, padding, shape) -> Accumulator:
    """out[n, o, y, x]: the exact sum over (c, a, b) of the padded window times w[o]."""
    batch, out_channels, rows, cols = shape
    laid = _window_columns(x, w.shape[2:], stride, padding, (rows, cols))
    flat = det_gemm_partial(laid, w.reshape(out_channels, -1))  # (N*OH*OW, O)
    return Accumulator(flat.digits.reshape(WIDTH, batch, rows, cols, out_channels).permute(0, 1, 4, 2, 3).contiguous())


def _weight_grad_factors(x: torch.Tensor, g: torch.Tensor, stride, padding, shape) -> tuple:
    """(left (O, N*OH*OW), right (C*KH*KW, N*OH*OW)): dw is left @ right.T, reshaped."""
    laid = _window_columns(x, shape[2:], stride, padding, g.shape[2:])
    return _by_channel(g).T.contiguous(), laid.T.contiguous()


def conv2d_weight_grad(x: torch.Tensor, g: torch.Tensor, stride, padding, shape) -> Accumulator:
    """dw[o, c, a, b]: the exact sum over (n, y, x) of g[n, o, y, x] times the padded window."""
    return shaped(det_gemm_partial(*_weight_grad_factors(x, g, stride, padding, shape)), shape)


def rounded_conv2d_weight_grad(x: torch.Tensor, g: torch.Tensor, stride, padding, shape) -> torch.Tensor:
    """conv2d_weight_grad rounded once into float32, by det_gemm's fast path."""
    return det_gemm(*_weight_grad_factors(x, g, stride, padding, shape), non_blocking=True).reshape(shape)


def spread(parts: list, shape, kernel, stride, counts) -> Accumulator:
    """At every element of an image of `shape`, the exact sum of the accumulators parts[i]
    (N, C, OH, OW) placed at window offset i: one accumulator per offset, combined."""
    placed = []
    for index, offset in enumerate(offsets(kernel)):
        digits = torch.zeros((WIDTH, *shape), dtype=torch.int64, device=parts[index].device)
        at_offset(digits.permute(1, 2, 3, 4, 0), offset, stride, counts).copy_(parts[index].digits.permute(1, 2, 3, 4, 0))
        placed.append(Accumulator(digits))
    return det_combine(placed)


def conv2d_input_grad(g: torch.Tensor, w: torch.Tensor, stride, padding, shape) -> Accumulator:
    """dx[n, c, i, j]: the exact sum, over the windows reaching (i, j) and the channels o, of
    g[n, o, y, x] * w[o, c, a, b]; what falls on padding is dropped."""
    batch, channels, height, width = shape
    (pad_rows, pad_cols), counts = padding, tuple(g.shape[2:])
    rows = _by_channel(g)  # (N*OH*OW, O)
    parts = []
    for a, b in offsets(w.shape[2:]):
        acc = det_gemm_partial(w[:, :, a, b].T.contiguous(), rows)  # (C, N*OH*OW)
        parts.append(Accumulator(acc.digits.reshape(WIDTH, channels, batch, *counts).transpose(1, 2)))
    padded_shape = (batch, channels, height + 2 * pad_rows, width + 2 * pad_cols)
    total = spread(parts, padded_shape, w.shape[2:], stride, counts).digits
    return Accumulator(total[:, :, :, pad_rows : pad_rows + height, pad_cols : pad_cols + width].contiguous())


def window_sums(x: torch.Tensor, kernel, stride, counts) -> Accumulator:
    """The exact sum of each (KH, KW) window of x, (N, C, OH, OW)."""
    return det_sum_partial(torch.stack([at_offset(x, offset, stride, counts) for offset in offsets(kernel)], -1), -1)


def spread_values(values_at, shape, kernel, stride, counts) -> Accumulator:
    """Each element's exact sum of values_at(i) (N, C, OH, OW) over the windows reaching it."""
    parts = [det_sum_partial(values_at(index)[..., None], -1) for index in range(len(offsets(kernel)))]
    return spread(parts, shape, kernel, stride, counts)


# --- maxima: exact in any order, with the interpreter's zeros and NaNs --------------------------


def maxima(x: torch.Tensor, axes, keep: bool = False) -> torch.Tensor:
    """The largest element over `axes`, as the interpreter takes it (cpu/folds.reduce_max):
    NaN where any element is NaN, and +0 where the largest is a zero and some zero is +0."""
    axes = tuple(axes)
    if not axes:
        return x.clone()
    result = torch.amax(x, dim=axes, keepdim=keep)
    # +0 is the one value whose bits are all zero: two passes over x, where a mask of zeros,
    # their signs and their conjunction took five
    bits = x.view(SAME_WIDTH_INTEGER[x.element_size()])
    positive_zero = (bits == 0).any(dim=axes, keepdim=keep)
    zeros = torch.where(positive_zero, 0.0, -0.0).to(x.dtype)
    result = torch.where(result == 0, zeros, result)
    # a NaN's bits are the largest among the NaNs it saw, as the interpreter's (numpy's) NaN is
    # the one it met, where torch's amax makes its own (all bits set on CPU)
    none = torch.iinfo(bits.dtype).min
    nan_bits = torch.where(torch.isnan(x), bits, none).amax(dim=axes, keepdim=keep)
    return torch.where(nan_bits != none, nan_bits.view(x.dtype), result)


SAME_WIDTH_INTEGER = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # by element size in bytes


def window_maxima(x: torch.Tensor, kernel, stride, counts) -> torch.Tensor:
    """The largest element of each (KH, KW) window of x, (N, C, OH, OW): max_pool2d."""
    return maxima(torch.stack([at_offset(x, offset, stride, counts) for offset in offsets(kernel)]), (0,))


def first_maxima(x: torch.Tensor, kernel, stride, counts) -> torch.Tensor:
    """For every window, the index in C order of its first maximum (or first NaN), as the
    interpreter finds it (cpu/conv.first_maxima)."""
    window = offsets(kernel)
    best = at_offset(x, window[0], stride, counts)
    where = torch.zeros(best.shape, dtype=torch.int64, device=x.device)
    for index, offset in enumerate(window[1:], start=1):
        value = at_offset(x, offset, stride, counts)
        better = (value > best) | (torch.isnan(value) & ~torch.isnan(best))
        best = torch.where(better, value, best)
        where = torch.where(better, index, where)
    return where


def max_pool2d_grad(x: torch.Tensor, g: torch.Tensor, kernel, stride, shape) -> Accumulator:
    """Each element's exact sum of the cotangents g (N, C, OH, OW) of the windows whose first
    maximum it is."""
    counts = tuple(g.shape[2:])
    first = first_maxima(x, kernel, stride, counts)
    zero = torch.zeros((), dtype=g.dtype, device=g.device)
    return spread_values(lambda index: torch.where(first == index, g, zero), shape, kernel, stride, counts)


def max_pool2d_pick(x: torch.Tensor, h: torch.Tensor, kernel, stride, counts) -> torch.Tensor:
    """h (N, C, H, W) read at each window's first maximum of x: (N, C, OH, OW)."""
    first = first_maxima(x, kernel, stride, counts)
    picked = torch.zeros(first.shape, dtype=h.dtype, device=h.device)
    for index, offset in enumerate(offsets(kernel)):
        picked = torch.where(first == index, at_offset(h, offset, stride, counts), picked)
    return picked


# --- the gradient region: accumulators in, accumulators out ----------------------------------


def added(accumulators: list, shape) -> Accumulator:
    return det_combine([Accumulator(acc.digits.broadcast_to(WIDTH, *shape).contiguous()) for acc in accumulators])


def transposed(acc: Accumulator, perm) -> Accumulator:
    return Accumulator(acc.digits.permute(0, *[axis + 1 for axis in perm]).contiguous())


def constant(value: float, shape, device) -> Accumulator:
    return det_sum_partial(torch.full((*shape, 1), value, dtype=torch.float32, device=device), -1)
