"""Exact GEMMs and sums with a Kulisch long accumulator: results are fixed functions of the inputs.

Every product of two bf16 or f32 values is formed exactly and added, as an integer, into
signed int64 digits in radix 2**32 that span every product's exponent range. Integer
addition is associative, so splitting K into shards, grouping the partial sums in any
tree, or summing them across processes gives the same digits; each output is rounded
once, to nearest with ties to even. See docs/exact.md.

    y = det_gemm(x, w)                                   # x @ w.T, x (M, K), w (N, K)
    a1 = det_gemm_partial(x[:, :k], w[:, :k])
    a2 = det_gemm_partial(x[:, k:], w[:, k:])
    assert torch.equal(det_finalize(det_combine([a1, a2])), y)
    y = det_finalize(det_all_reduce(det_gemm_partial(x_shard, w_shard)))
    ys = det_gemm_batched(xs, ws)                        # xs[b] @ ws[b].T, each det_gemm's bits
    g = det_scatter_sum(ids, grads, rows)                # row r: the sum of grads[i] where ids[i] == r

This package imports nothing else of SexpGPU, so that it also loads as a `kernels` kernel.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as missing:  # pragma: no cover - torch is installed wherever tests run
    raise ImportError("sexpgpu.exact needs PyTorch: pip install 'sexpgpu[torch]'") from missing

from . import implementations, layout
from .accumulator import Accumulator
from .batched import det_gemm_batched
from .distributed import det_all_reduce
from .gemm import det_combine, det_finalize, det_gemm, det_gemm_partial
from .linear import DetLinear
from .reduce import det_sum, det_sum_partial
from .scatter import det_scatter_sum, det_scatter_sum_partial

__all__ = [
    "Accumulator",
    "DetLinear",
    "implementations",
    "det_all_reduce",
    "det_combine",
    "det_finalize",
    "det_gemm",
    "det_gemm_batched",
    "det_gemm_partial",
    "det_scatter_sum",
    "det_scatter_sum_partial",
    "det_sum",
    "det_sum_partial",
    "layout",
]
