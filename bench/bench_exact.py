"""Exact GEMM throughput on a CUDA GPU, against cuBLAS measured in the same run.

    PYTHONPATH=src python bench/bench_exact.py [--json results.json] [--sizes 1024 4096 8192]
    PYTHONPATH=src python bench/bench_exact.py --cpu     # no GPU needed: exact f32 at 1024^3 on CPU
    PYTHONPATH=src python bench/bench_exact.py --smoke   # every row and table at 16^3, once (bench/smoke.py)

TFLOP/s counts 2*M*N*K per product, as for any GEMM; every exact figure is the whole
det_gemm call (special-value check, the default implementation, carries, the one rounding).
Rows, at each size n^3:
  randn               exact f32 and exact bf16 inputs, and their ratio to cuBLAS float32
                      (TF32 off) and cuBLAS bf16 on the same data (ratio > 1: exact is faster)
  spread 2^+-s        f32 values scaled by 2**e, e uniform in [-s, s): more slices per block
  outlier per row     randn rows with one element 2**60 larger: the rest lie far below it
  whole range         every exponent from 2**-149 to 2**126 in each row: the worst case
Each exact row also says what det_gemm's fast path did on its last call (bounded_gemm.py): the
first stage (the residue product on int8 tensor cores, or the float64 product) and the share
of outputs it settled, the outputs refined by pair sums, the tiers it
computed and the fraction of outputs it sent to the exact accumulator. Then
DetLinear 4096x4096, batch 4096, forward + backward against nn.Linear float32, and the
previous default (the Triton fp64 kernel) at 1024^3 for reference. Runs in about two
minutes on an H200. --cpu: det_gemm f32 at 1024^3 against torch.matmul f32 on the same cores.
--smoke: the --cpu row and the GPU's rows at 16^3, one call each; without a GPU on CPU tensors,
the Triton kernels in its interpreter and the "cuBLAS" columns torch's CPU products.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import torch

import smoke  # before the kernels are decorated
from sexpgpu.exact import DetLinear, det_gemm
from sexpgpu.exact import implementations
from sexpgpu.exact import bounded_gemm

REPEATS = {1024: 10, 4096: 3, 8192: 2}
SMOKE_SIZE = 16
DEVICE = "cuda"  # where the GPU's rows run: "cpu" in a smoke run without a GPU


@dataclass
class Row:
    size: int
    data: str
    exact_f32: float  # TFLOP/s
    exact_bf16: float | None
    cublas_f32: float | None
    cublas_bf16: float | None
    tiers: int = 0  # tiers of slice products the fast path ran (f32 call)
    fallback: float = 0.0  # fraction of outputs that the exact accumulator computed (f32 call)
    first_stage: str = ""  # which first stage the f32 call took: "residues" or "float64"
    first: float = 0.0  # fraction of outputs that it settled
    pairs: int = 0  # outputs refined by pair sums (f32 call)
    float64_f32: float | None = None  # exact f32 TFLOP/s with the float64 product as the first stage (the previous default)


def seconds_per_call(fn, repeats: int) -> float:
    fn()  # warm-up: compilation, allocator
    synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize()
    return (time.perf_counter() - started) / repeats


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


FIRST_STAGES = {"residues": "residue product", "float64": "float64 product"}


def fast_path_figures() -> dict:
    stats = bounded_gemm.last_statistics
    outputs = max(stats.outputs, 1)
    return {"tiers": stats.tiers, "fallback": stats.fallback / outputs, "first_stage": stats.first_stage,
            "first": stats.first_settled / outputs, "pairs": stats.pairs}


def path_text(figures: dict) -> str:
    """What the fast path did, from fast_path_figures' keys."""
    stage = FIRST_STAGES.get(figures["first_stage"], "no first stage")
    return (f"{stage} settled {figures['first']:.3%}, {figures['pairs']} pair sums, "
            f"{figures['tiers']} tiers, {figures['fallback']:.3%} to the exact accumulator")


def tflops(n: int, seconds: float) -> float:
    return 2 * n**3 / seconds / 1e12


def scaled_randn(n: int, seed: int, spread: int | None) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    values = torch.randn(n, n, device=DEVICE, generator=generator)
    if spread:
        exponents = torch.randint(-spread, spread, (n, n), device=DEVICE, generator=generator)
        values = values * torch.exp2(exponents.float())
    return values


def with_outliers(n: int, seed: int) -> torch.Tensor:
    values = scaled_randn(n, seed, None)
    values[:, seed % n] *= 2.0**60
    return values


def whole_range(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    exponents = torch.randint(-149, 127, (n, n), device=DEVICE, generator=generator).double()
    values = torch.rand(n, n, device=DEVICE, generator=generator, dtype=torch.float64) + 1
    return (values * torch.exp2(exponents)).clamp(max=3.0e38).float()


ADVERSARIAL = {
    "spread 2^+-8": lambda n, seed: scaled_randn(n, seed, 8),
    "spread 2^+-40": lambda n, seed: scaled_randn(n, seed, 40),
    "outlier per row": with_outliers,
    "whole range": whole_range,
}


def randn_row(n: int) -> Row:
    x, w = scaled_randn(n, 1, None), scaled_randn(n, 2, None)
    xb, wb = x.bfloat16(), w.bfloat16()
    repeats = REPEATS.get(n, 1)
    cublas_repeats = min(1000, max(3, int(2e12 // (2 * n**3))))
    exact_f32 = tflops(n, seconds_per_call(lambda: det_gemm(x, w), repeats))
    figures = fast_path_figures()
    with bounded_gemm.forced("float64"):
        float64_f32 = tflops(n, seconds_per_call(lambda: det_gemm(x, w), repeats))
    return Row(n, "randn", exact_f32=exact_f32, float64_f32=float64_f32,
               exact_bf16=tflops(n, seconds_per_call(lambda: det_gemm(xb, wb), repeats)),
               cublas_f32=tflops(n, seconds_per_call(lambda: x @ w.T, cublas_repeats)),
               cublas_bf16=tflops(n, seconds_per_call(lambda: xb @ wb.T, cublas_repeats)), **figures)


def adversarial_rows(n: int) -> list[Row]:
    rows = []
    for name, make in ADVERSARIAL.items():
        x, w = make(n, 3), make(n, 4)
        exact_f32 = tflops(n, seconds_per_call(lambda: det_gemm(x, w), 1))
        rows.append(Row(n, name, exact_f32, None, None, None, **fast_path_figures()))
        del x, w
    return rows


def det_linear_figures(batch: int = 4096, width: int = 4096) -> dict:
    x = torch.randn(batch, width, device=DEVICE)
    flops = 3 * 2 * batch * width * width  # forward, grad input, grad weight
    figures = {}
    for name, layer in [("DetLinear", DetLinear(width, width, device=DEVICE)),
                        ("nn.Linear f32", torch.nn.Linear(width, width, device=DEVICE))]:
        xi = x.clone().requires_grad_(True)

        def forward_backward():
            layer.zero_grad()
            layer(xi).square().mean().backward()

        figures[name] = flops / seconds_per_call(forward_backward, 1 if batch == SMOKE_SIZE else 3) / 1e12
    return figures


def previous_default(n: int = 1024) -> float:
    x, w = scaled_randn(n, 1, None), scaled_randn(n, 2, None)
    with implementations.forced("triton"):
        return tflops(n, seconds_per_call(lambda: det_gemm(x, w), 1 if n == SMOKE_SIZE else 3))


def cpu_figures(n: int = 1024) -> dict:
    """det_gemm f32 against torch.matmul f32 on this machine's CPU cores, at n^3 (randn)."""
    generator = torch.Generator().manual_seed(1)
    x, w = torch.randn(n, n, generator=generator), torch.randn(n, n, generator=generator)
    exact = seconds_per_call(lambda: det_gemm(x, w), 2)
    figures = fast_path_figures()
    matmul = seconds_per_call(lambda: x @ w.T, 10)
    return {"size": n, "threads": torch.get_num_threads(), "det_gemm s": exact, "matmul s": matmul,
            "ratio": exact / matmul, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 8192], choices=sorted(REPEATS))
    parser.add_argument("--cpu", action="store_true", help="only the CPU row: exact f32 at 1024^3 against torch.matmul")
    smoke.add_option(parser)
    args = parser.parse_args()
    if args.cpu or args.smoke:
        cpu = cpu_figures(SMOKE_SIZE if args.smoke else 1024)
        print(f"CPU ({cpu['threads']} threads) {cpu['size']}^3 f32 randn: det_gemm {cpu['det_gemm s'] * 1e3:.0f} ms, "
              f"torch.matmul {cpu['matmul s'] * 1e3:.1f} ms: det_gemm is {cpu['ratio']:.1f}x slower "
              f"(fast path: {path_text(cpu)})")
        if args.json and not args.smoke:
            with open(args.json, "w") as f:
                json.dump({"cpu": cpu}, f, indent=2)
        if args.cpu:
            return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    started = time.perf_counter()
    linear_size, triton_size = 4096, 1024
    if args.smoke:
        global DEVICE
        DEVICE = "cuda" if smoke.gpu() else "cpu"
        args.sizes, linear_size, triton_size = [SMOKE_SIZE], SMOKE_SIZE, SMOKE_SIZE
    default = implementations.select(torch.device(DEVICE)).name
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU tensors (cuBLAS columns: torch on the CPU)"
    print(f"device: {where}, torch {torch.__version__}, default exact implementation: {default}")
    rows = []
    for n in args.sizes:
        rows.append(randn_row(n))
        rows.extend(adversarial_rows(n))
    linear = det_linear_figures(linear_size, linear_size)
    triton_tflops = previous_default(triton_size)
    report(rows, linear, triton_tflops, linear_size, triton_size)
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": [asdict(r) for r in rows], "linear": linear, "triton 1024^3": triton_tflops}, f, indent=2)


def report(rows: list[Row], linear: dict, triton_tflops: float, linear_size: int = 4096, triton_size: int = 1024) -> None:
    """One table; ratios are exact over cuBLAS (1.0 = as fast), slowdowns against randn f32."""
    print(f"\n{'size':>6} {'data':<16} {'exact f32':>10} {'/cuBLAS f32':>11} {'exact bf16':>10} {'/cuBLAS bf16':>12}   TFLOP/s")
    randn_by_size = {r.size: r for r in rows if r.data == "randn"}
    worst = min((r for r in rows if r.data != "randn"), key=lambda r: r.exact_f32 / randn_by_size[r.size].exact_f32)
    for r in rows:
        if r.data == "randn":
            print(f"{r.size:>6} {r.data:<16} {r.exact_f32:10.2f} {r.exact_f32 / r.cublas_f32:10.3f}x "
                  f"{r.exact_bf16:10.2f} {r.exact_bf16 / r.cublas_bf16:11.3f}x   "
                  f"(cuBLAS f32 {r.cublas_f32:.1f}, bf16 {r.cublas_bf16:.1f}; with the float64 product first "
                  f"{r.float64_f32:.2f}, {r.float64_f32 / r.cublas_f32:.3f}x; {path_text(asdict(r))})")
        else:
            slowdown = randn_by_size[r.size].exact_f32 / r.exact_f32
            print(f"{r.size:>6} {r.data:<16} {r.exact_f32:10.2f}   ({slowdown:.1f}x slower than randn f32; "
                  f"{path_text(asdict(r))})")
    print(f"\nworst adversarial case: {worst.data} at {worst.size}^3, "
          f"{randn_by_size[worst.size].exact_f32 / worst.exact_f32:.1f}x slower than randn f32")
    ratio = linear["nn.Linear f32"] / linear["DetLinear"]
    print(f"DetLinear {linear_size}x{linear_size} batch {linear_size} forward+backward: {linear['DetLinear']:.2f} TFLOP/s, "
          f"nn.Linear f32 {linear['nn.Linear f32']:.2f}: DetLinear is {ratio:.2f}x slower")
    print(f"previous default (Triton fp64 kernel) at {triton_size}^3: {triton_tflops:.3f} TFLOP/s")


if __name__ == "__main__":
    main()
