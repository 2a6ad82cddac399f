"""DetLinear: nn.Linear whose forward and backward products are exact and rounded once."""

from __future__ import annotations

import math

import torch
from torch import nn

from .accumulator import Accumulator, normalise_
from .checks import check_operand
from .distributed import det_all_reduce
from .gemm import det_combine, det_finalize, det_gemm_partial, rounded_product
from .reduce import det_sum, det_sum_partial


class DetLinear(nn.Module):
    """y = x @ weight.T + bias with the bias folded into the exact sum, so y rounds once.

    The products go through det_gemm's fast paths: on CUDA with float32 results the queued
    path (queued.py), which never waits for the device, so that a training step's launches run
    ahead of its kernels; elsewhere the host path (bounded_gemm.py). K-shards and reduced gradients
    compose exact accumulators instead. Every path gives the same bits.

    Backward gives grad input, grad weight and grad bias as exact sums rounded once, in the
    parameters' dtype. Options beyond nn.Linear's:
      k_shards: compose the forward from K-shards, an int (that many near-equal shards) or
        the indices at which K is cut; the result is the same bits for every choice.
      reduce_gradients, group: sum the weight and bias gradients exactly over the ranks of
        `group` (the default group if None) before rounding, for data parallelism over the
        batch; each rank's loss must then be its share of the global batch's loss.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 *, k_shards=1, reduce_gradients: bool = False, group=None):
        super().__init__()
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"DetLinear: dtype must be torch.float32 or torch.bfloat16, not {dtype}")
        self.in_features, self.out_features = in_features, out_features
        self.k_shards, self.reduce_gradients, self.group = k_shards, reduce_gradients, group
        self.weight = nn.Parameter(torch.empty((out_features, in_features), device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's initialisation: uniform in +-1/sqrt(in_features), from torch's generator.
        bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_operand("DetLinear", "x", x)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"DetLinear: expected input with last dimension {self.in_features}, got shape {tuple(x.shape)}")
        if x.dtype != self.weight.dtype:
            raise TypeError(f"DetLinear: input has dtype {x.dtype} and the layer {self.weight.dtype}; convert one of them")
        gradient_group = (self.group,) if self.reduce_gradients else None
        y = _ExactLinear.apply(x.reshape(-1, self.in_features), self.weight, self.bias, self.k_shards, gradient_group)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class _ExactLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, k_shards, gradient_group):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.gradient_group = bias is not None, gradient_group
        if k_shards != 1:
            acc = _sharded_product(x, weight, k_shards)
            if bias is not None:
                acc = _plus_row(acc, det_sum_partial(bias.unsqueeze(1), 1))
            return det_finalize(acc, x.dtype)
        if bias is not None:  # bias * 1 is one more product of the same exact sum
            x = torch.cat([x, torch.ones((x.shape[0], 1), dtype=x.dtype, device=x.device)], 1)
            weight = torch.cat([weight, bias.unsqueeze(1)], 1)
        return rounded_product(x, weight, x.dtype, non_blocking=True)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_y = grad_y.to(weight.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = rounded_product(grad_y, weight.t(), x.dtype, non_blocking=True)
        if ctx.needs_input_grad[1] and ctx.gradient_group is None:
            grad_w = rounded_product(grad_y.t(), x.t(), weight.dtype, non_blocking=True)
        elif ctx.needs_input_grad[1]:
            grad_w = _reduced(det_gemm_partial(grad_y.t(), x.t()), ctx.gradient_group, weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2] and ctx.gradient_group is None:
            grad_b = det_sum(grad_y, 0, dtype=weight.dtype)
        elif ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = _reduced(det_sum_partial(grad_y, 0), ctx.gradient_group, weight.dtype)
        return grad_x, grad_w, grad_b, None, None


def _sharded_product(x, weight, k_shards) -> Accumulator:
    pieces = zip(torch.tensor_split(x, k_shards, dim=1), torch.tensor_split(weight, k_shards, dim=1))
    return det_combine([det_gemm_partial(x_part, w_part) for x_part, w_part in pieces])


def _plus_row(acc: Accumulator, row: Accumulator) -> Accumulator:
    """acc (M, N) plus row (N,) added to every row, exactly."""
    return Accumulator(normalise_(acc.digits + row.digits.unsqueeze(1)))


def _reduced(acc: Accumulator, gradient_group, dtype) -> torch.Tensor:
    if gradient_group is not None:
        det_all_reduce(acc, gradient_group[0])
    return det_finalize(acc, dtype)
