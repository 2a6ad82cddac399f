"""Exact sums of rows picked by ids: an embedding's gradient, where row r sums the value rows whose id is r.

    acc = det_scatter_sum_partial(ids, values, rows)   # an Accumulator of shape (rows, *values.shape[ids.dim():])
    y = det_scatter_sum(ids, values, rows)             # the same, each sum rounded once into float32

The sums are exact, so the order in which a row's values arrive does not matter. On the host,
each id's value rows are laid side by side (padded with zeros, which add nothing) and summed
in one call. On CUDA no count is read back: the rows are sorted by id (a stable sort) and
each output row adds its own rows' values in Kulisch digit registers in one kernel
(queued_kernels._scatter_sums), no atomics, carried and, for det_scatter_sum, rounded there.

Ids must lie in 0 .. rows - 1. The host path refuses others with ValueError; on CUDA checking
them would wait for the device, so an id outside is left out of every row: check ids first
(a SexpGPU run does, E-INDEX-001).
"""

from __future__ import annotations

import math

import torch

from . import implementations
from .accumulator import Accumulator
from .checks import check_operand, check_output_dtype
from .gemm import det_finalize
from .layout import MAX_K_PER_CALL, WIDTH
from .reduce import det_sum_partial

BLOCK_D = 64  # columns of an output row one program sums


def det_scatter_sum_partial(ids: torch.Tensor, values: torch.Tensor, rows: int) -> Accumulator:
    """Row r: the exact sum of values[i] over the positions i of ids that hold r, unrounded."""
    fn = "det_scatter_sum_partial"
    width = _check(fn, ids, values, rows)
    if _on_device(values):
        return _device_sums(ids, values, rows, width, digits=True)
    return _host_sums(fn, ids, values, rows, width)


def det_scatter_sum(ids: torch.Tensor, values: torch.Tensor, rows: int, dtype: torch.dtype = torch.float32):
    """det_scatter_sum_partial rounded once into dtype (float32 or bfloat16)."""
    fn = "det_scatter_sum"
    width = _check(fn, ids, values, rows)
    check_output_dtype(fn, dtype)
    if dtype == torch.float32 and _on_device(values):
        return _device_sums(ids, values, rows, width, digits=False)
    return det_finalize(_host_sums(fn, ids, values, rows, width), dtype)


def _on_device(values: torch.Tensor) -> bool:
    return implementations.on_device(values.device) and not implementations.forcing()


def _check(fn: str, ids, values, rows: int) -> int:
    """The width of a value row; ids an integer tensor whose shape leads values'."""
    check_operand(fn, "values", values)
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{fn}: ids must be an integer torch.Tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
    if tuple(values.shape[:ids.dim()]) != tuple(ids.shape):
        raise ValueError(f"{fn}: values of shape {tuple(values.shape)} do not begin with the ids' shape "
                         f"{tuple(ids.shape)}")
    if ids.device != values.device:
        raise ValueError(f"{fn}: ids are on {ids.device} and values on {values.device}; they must be on one device")
    return math.prod(values.shape[ids.dim():])


def _host_sums(fn: str, ids, values, rows: int, width: int) -> Accumulator:
    """Each id's rows laid side by side, padded with zeros, and summed in one call."""
    flat = ids.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= rows):
        raise ValueError(f"{fn}: an id lies outside 0..{rows - 1}")
    digits = torch.zeros((WIDTH, rows, width), dtype=torch.int64, device=values.device)
    if flat.numel():
        order = torch.argsort(flat, stable=True)
        named, counts = torch.unique_consecutive(flat[order], return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        slots = torch.repeat_interleave(torch.arange(named.numel(), device=flat.device), counts)
        ranks = torch.arange(flat.numel(), device=flat.device) - torch.repeat_interleave(starts, counts)
        laid = torch.zeros((named.numel(), int(counts.max()), width), dtype=values.dtype, device=values.device)
        laid[slots, ranks] = values.reshape(-1, width)[order]
        digits[:, named] = det_sum_partial(laid, 1).digits
    return Accumulator(digits.reshape(WIDTH, rows, *values.shape[ids.dim():]))


def _device_sums(ids, values, rows: int, width: int, digits: bool):
    """The kernel's sums: each output row from its ids' rows in sorted order, no count read back."""
    from .queued_kernels import _scatter_sums  # Triton is imported only where it runs

    flat = ids.reshape(-1).to(torch.int64)
    terms = values.reshape(flat.numel(), width)
    terms = terms.float() if terms.dtype == torch.bfloat16 else terms  # widening is exact
    order = torch.argsort(flat, stable=True)
    bounds = torch.searchsorted(flat[order], torch.arange(rows + 1, device=flat.device))
    shape = (rows, *values.shape[ids.dim():])
    planes = torch.empty((WIDTH, rows, width) if digits else (1,), dtype=torch.int64, device=values.device)
    result = torch.empty((1,) if digits else (rows, width), dtype=torch.float32, device=values.device)
    if rows and width:
        grid = (rows, -(-width // BLOCK_D))
        _scatter_sums[grid](terms, order, bounds, result, planes, width, rows * width, terms.stride(0),
                            terms.stride(1), DIGITS=digits, BLOCK_D=BLOCK_D, FLUSH=MAX_K_PER_CALL, num_warps=2)
    elif digits:
        planes.zero_()
    return Accumulator(planes.reshape(WIDTH, *shape)) if digits else result.reshape(shape)
