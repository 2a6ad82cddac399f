"""Summing accumulators across processes: one integer all-reduce of the planes."""

from __future__ import annotations

import torch

from .accumulator import Accumulator, normalise_
from .checks import check_accumulator


def det_all_reduce(acc: Accumulator, group=None) -> Accumulator:
    """Sum `acc` over the ranks of `group` (the default group if None), exactly, in place.

    The planes travel as one int64 all-reduce through torch.distributed (NCCL for CUDA
    tensors, gloo for CPU tensors). Integer addition is associative, so the result does not
    depend on the reduction's algorithm or order, and every rank holds the same bits.
    Normalised digits are below 2**32, so up to 2**30 ranks add without overflow.
    """
    import torch.distributed as dist

    check_accumulator("det_all_reduce", acc)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("det_all_reduce: torch.distributed is not initialised; call init_process_group first")
    _check_backend_device(dist.get_backend(group), acc.device)
    dist.all_reduce(acc.digits, op=dist.ReduceOp.SUM, group=group)
    normalise_(acc.digits)
    return acc


def _check_backend_device(backend: str, device: torch.device) -> None:
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"det_all_reduce: the group uses NCCL, which reduces CUDA tensors; the accumulator is on {device}")
    if backend == "gloo" and device.type not in ("cpu", "cuda"):
        raise ValueError(f"det_all_reduce: the group uses gloo, which cannot reduce tensors on {device}")
