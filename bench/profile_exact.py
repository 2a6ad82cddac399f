"""Where det_gemm's time goes on a CUDA GPU: each stage of the fast path timed on its own.

    PYTHONPATH=src python bench/profile_exact.py [--size 8192] [--dtype float32|bfloat16] [--smoke]

randn operands of size n^3. The stages are those of bounded_gemm.py: the widening of both operands
(float64 copies and norm bounds in one pass), the float64 product (chunked addmm), the settling pass, the pending list, the pair sums and
their settling, the exact fallback for what is left. Beside them: cuBLAS float64 and float32
(TF32 off) products of the same size, the floor and the peer. Each figure is the median of
five calls after a warm-up. --smoke: 16^3, one call each (bench/smoke.py); without a GPU on
CPU tensors, the kernels in Triton's interpreter and "cuBLAS" torch's CPU products.
"""

from __future__ import annotations

import argparse

import torch

import smoke  # before the kernels are decorated
from bench_numerics import gpu_seconds
from sexpgpu.exact import det_gemm
from sexpgpu.exact import bounded_gemm
from sexpgpu.exact.float64_stage import CHUNK, float64_product, float64_total, widened
from sexpgpu.exact.pair_sums import pair_sums


def milliseconds(fn, repeat: int = 5) -> float:
    return gpu_seconds(fn, repeat=repeat) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--trace", action="store_true", help="also print the CUDA kernels of one det_gemm call")
    smoke.add_option(parser)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    device, repeat = "cuda", 5
    if args.smoke:
        args.size, repeat, device = 16, 1, "cuda" if smoke.gpu() else "cpu"
    n, dtype = args.size, getattr(torch, args.dtype)
    generator = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(n, n, device=device, generator=generator).to(dtype)
    w = torch.randn(n, n, device=device, generator=generator).to(dtype)
    x64, w64 = x.double(), w.double()
    first = float64_product(x, w)
    done, _ = bounded_gemm._settled_product(first, torch.float32)
    rows, cols = (~done).nonzero(as_tuple=True)
    flops = 2 * n**3
    figures = {
        "cuBLAS float64 x @ w.T, one call": milliseconds(lambda: x64 @ w64.T, repeat),
        "cuBLAS float32 x @ w.T (TF32 off)": milliseconds(lambda: x.float() @ w.float().T, repeat),
        "widening of x and w (float64 copies, norm bounds)": milliseconds(lambda: (widened(x), widened(w)), repeat),
        f"float64 product in chunks of {CHUNK} (addmm)": milliseconds(lambda: float64_total(x64, w64), repeat),
        "settling the float64 product": milliseconds(lambda: bounded_gemm._settled_product(first, torch.float32), repeat),
        "the pending list (nonzero)": milliseconds(lambda: (~done).nonzero(as_tuple=True), repeat),
        f"pair sums of the {rows.numel()} pending outputs": milliseconds(
            lambda: pair_sums(x, w, rows, cols, first.x_norm, first.w_norm), repeat),
        "exact digits of the same outputs (accumulate_pairs)": milliseconds(
            lambda: bounded_gemm._pair_planes(x, w, rows, cols), repeat),
        "det_gemm, whole": milliseconds(lambda: det_gemm(x, w), repeat),
    }
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU tensors (Triton's interpreter)"
    print(f"{where}, {n}^3 {args.dtype} randn; {bounded_gemm.last_statistics}")
    for name, ms in figures.items():
        print(f"  {name:<56} {ms:9.3f} ms  {flops / ms / 1e9:8.2f} TFLOP/s-equivalent")
    if args.trace and device == "cpu":
        smoke.skipped("--trace", "it traces CUDA kernels")
    elif args.trace:
        print_trace(lambda: det_gemm(x, w))


def print_trace(fn) -> None:
    """The kernels and host calls of one call, by total time: where the fixed costs are."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
        fn()
        torch.cuda.synchronize()
    print(trace.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    print(trace.key_averages().table(sort_by="cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
