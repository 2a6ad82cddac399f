"""Exact GEMM throughput on a CUDA GPU, against cuBLAS measured in the same run.

    PYTHONPATH=src python bench/bench_exact.py [--json results.json] [--skip-8192]

TFLOP/s counts 2*M*N*K per product, as for any GEMM. Rows:
  det_gemm n^3          the whole call: special-value check, Triton kernel, carries, rounding
  kernel n^3            the Triton kernel alone (its int64 digit planes)
  DetLinear 4096        forward, and forward + backward (grad input, weight, bias), batch 4096
  cuBLAS f32 / bf16     torch.matmul with TF32 off, and in bf16, at the same shapes
  sliced n^3            the fp64-slice implementation on cuBLAS DGEMM (not the default), randn data
  tile sweep 2048^3     the Triton kernel at other tile sizes (every tile size gives the same bits)
Ratios are cuBLAS throughput over the exact one: how many times slower exactness is.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sexpgpu.exact import DetLinear, backends, det_gemm
from sexpgpu.exact import triton_kernel


def seconds_per_call(fn, repeats: int) -> float:
    fn()  # warm-up: compilation, allocator
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def tflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e12


def operands(n: int, dtype=torch.float32):
    generator = torch.Generator(device="cuda").manual_seed(n)
    return (torch.randn(n, n, device="cuda", generator=generator, dtype=dtype),
            torch.randn(n, n, device="cuda", generator=generator, dtype=dtype))


def cublas_rows(n: int) -> dict:
    x, w = operands(n)
    xb, wb = x.bfloat16(), w.bfloat16()
    repeats = min(1000, max(3, int(2e12 // (2 * n**3))))
    return {
        "cuBLAS f32": tflops(2 * n**3, seconds_per_call(lambda: x @ w.T, repeats)),
        "cuBLAS bf16": tflops(2 * n**3, seconds_per_call(lambda: xb @ wb.T, repeats)),
    }


def exact_rows(n: int, repeats: int) -> dict:
    x, w = operands(n)
    call_seconds = seconds_per_call(lambda: det_gemm(x, w), repeats)
    rows = {"det_gemm": tflops(2 * n**3, call_seconds), "det_gemm seconds": call_seconds}
    if n == 4096:
        rows["det_gemm bf16 inputs"] = tflops(2 * n**3, seconds_per_call(lambda: det_gemm(x.bfloat16(), w.bfloat16()), repeats))
        rows["kernel"] = tflops(2 * n**3, seconds_per_call(lambda: triton_kernel.accumulate(x, w), repeats))
        with backends.forced("sliced"):
            rows["sliced"] = tflops(2 * n**3, seconds_per_call(lambda: det_gemm(x, w), repeats))
    return rows


def det_linear_rows(batch: int = 4096, width: int = 4096) -> dict:
    x = torch.randn(batch, width, device="cuda")
    flops_forward = 2 * batch * width * width
    rows = {}
    for name, layer in [("DetLinear", DetLinear(width, width, device="cuda")),
                        ("nn.Linear f32", torch.nn.Linear(width, width, device="cuda")),
                        ("nn.Linear bf16", torch.nn.Linear(width, width, device="cuda", dtype=torch.bfloat16))]:
        xi = x.to(layer.weight.dtype).requires_grad_(True)

        def forward_backward():
            layer.zero_grad()
            layer(xi).square().mean().backward()

        with torch.no_grad():
            forward = seconds_per_call(lambda: layer(xi), 2)
        both = seconds_per_call(forward_backward, 2)
        rows[f"{name} forward"] = tflops(flops_forward, forward)
        rows[f"{name} forward+backward"] = tflops(3 * flops_forward, both)
    return rows


def tile_sweep(n: int = 2048) -> dict:
    x, w = operands(n)
    reference = triton_kernel.accumulate(x, w)
    rows = {}
    default = (triton_kernel.BLOCK_M, triton_kernel.BLOCK_N, triton_kernel.NUM_WARPS)
    for config in [(32, 32, 8), (32, 16, 4), (64, 16, 8), (16, 16, 2)]:
        triton_kernel.BLOCK_M, triton_kernel.BLOCK_N, triton_kernel.NUM_WARPS = config
        assert torch.equal(triton_kernel.accumulate(x, w), reference), f"tile {config} changed the digits"
        rows[f"tiles {config[0]}x{config[1]}, {config[2]} warps"] = tflops(2 * n**3, seconds_per_call(lambda: triton_kernel.accumulate(x, w), 2))
    triton_kernel.BLOCK_M, triton_kernel.BLOCK_N, triton_kernel.NUM_WARPS = default
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--skip-8192", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    results = {}
    sizes = [1024, 4096] if args.skip_8192 else [1024, 4096, 8192]
    for n in sizes:
        started = time.perf_counter()
        rows = {**exact_rows(n, repeats={1024: 5, 4096: 2, 8192: 1}[n]), **cublas_rows(n)}
        rows["wall seconds"] = time.perf_counter() - started
        results[f"{n}^3"] = rows
        report(f"{n}^3", rows)
    results["DetLinear 4096x4096, batch 4096"] = det_linear_rows()
    report("DetLinear 4096x4096, batch 4096", results["DetLinear 4096x4096, batch 4096"])
    results["tile sweep 2048^3"] = tile_sweep()
    report("tile sweep 2048^3 (Triton kernel alone)", results["tile sweep 2048^3"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def report(title: str, rows: dict) -> None:
    print(f"\n{title}")
    for name, value in rows.items():
        if name.endswith("seconds"):
            print(f"  {name:<34} {value:10.2f} s")
            continue
        exact = _exact_peer(name, rows)
        ratio = f"  ({value / exact:8.1f}x the exact one)" if exact else ""
        print(f"  {name:<34} {value:10.4f} TFLOP/s{ratio}")


def _exact_peer(name: str, rows: dict) -> float | None:
    """The exact row a cuBLAS row compares with: det_gemm, or DetLinear for the same pass."""
    if name.startswith("cuBLAS"):
        return rows.get("det_gemm")
    if name.startswith("nn.Linear"):
        return rows.get("DetLinear " + name.split(" ", 2)[2])
    return None


if __name__ == "__main__":
    main()
