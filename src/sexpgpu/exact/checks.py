"""Argument checks shared by the public functions. Each failure says what was expected."""

from __future__ import annotations

import torch

from .accumulator import Accumulator

INPUT_DTYPES = (torch.float32, torch.bfloat16)
OUTPUT_DTYPES = (torch.float32, torch.bfloat16)


def check_operand(fn: str, name: str, value) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in INPUT_DTYPES:
        raise TypeError(
            f"{fn}: {name} has dtype {value.dtype}; exact products are defined for torch.float32 "
            f"and torch.bfloat16 only (convert explicitly if the conversion is what you mean)"
        )


def check_gemm_operands(fn: str, x, w) -> None:
    """x (M, K) and w (N, K), as nn.Linear's input and weight, on one device with one dtype."""
    check_operand(fn, "x", x)
    check_operand(fn, "w", w)
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(
            f"{fn}: x must be (M, K) and w (N, K), got x of shape {tuple(x.shape)} and w of shape {tuple(w.shape)}"
        )
    if x.shape[1] != w.shape[1]:
        raise ValueError(
            f"{fn}: x is (M, K) = {tuple(x.shape)} and w is (N, K) = {tuple(w.shape)}: their K differ "
            f"({x.shape[1]} and {w.shape[1]}); the product is x @ w.T"
        )
    if x.dtype != w.dtype:
        raise TypeError(f"{fn}: x has dtype {x.dtype} and w has dtype {w.dtype}; they must be the same")
    if x.device != w.device:
        raise ValueError(f"{fn}: x is on {x.device} and w is on {w.device}; they must be on the same device")


def check_accumulator(fn: str, value) -> None:
    if not isinstance(value, Accumulator):
        raise TypeError(
            f"{fn}: expected an Accumulator (from det_gemm_partial, det_sum_partial or det_combine), "
            f"got {type(value).__name__}"
        )


def check_combinable(fn: str, accumulators) -> None:
    if isinstance(accumulators, Accumulator) or not hasattr(accumulators, "__iter__"):
        raise TypeError(f"{fn}: expected a list of Accumulators, got {type(accumulators).__name__}")
    if len(accumulators) == 0:
        raise ValueError(f"{fn}: expected at least one Accumulator, got an empty list")
    first = accumulators[0]
    for index, acc in enumerate(accumulators):
        check_accumulator(f"{fn} (item {index})", acc)
        if acc.shape != first.shape:
            raise ValueError(
                f"{fn}: item {index} holds outputs of shape {tuple(acc.shape)}, item 0 of shape "
                f"{tuple(first.shape)}; only partial sums of the same outputs combine"
            )
        if acc.device != first.device:
            raise ValueError(f"{fn}: item {index} is on {acc.device}, item 0 on {first.device}; move them to one device")


def check_output_dtype(fn: str, dtype) -> None:
    if dtype not in OUTPUT_DTYPES:
        raise TypeError(f"{fn}: results round to torch.float32 or torch.bfloat16, not {dtype}")


def check_dim(fn: str, x: torch.Tensor, dim) -> int:
    if x.dim() == 0:
        raise ValueError(f"{fn}: x is a 0-d tensor; there is no dimension to sum over")
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{fn}: dim must be an int, got {type(dim).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{fn}: dim {dim} is out of range for a tensor of {x.dim()} dimensions")
    return dim % x.dim()
