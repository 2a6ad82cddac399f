"""The fused attention kernels (backends/cuda/codegen/attention.py) alone, on one GPU: their
error against a float64 reference, two runs giving the same bits, and their time against
PyTorch's F.scaled_dot_product_attention, forward and backward, at gpt-50m's shape; the
backward both with dS in memory (the lowering's choice while dS fits its budget) and with
backward_q recomputing the probabilities (longer sequences).

    PYTHONPATH=src python3 bench/bench_attention.py [--shape B,H,T,E] [--repeats N] [--smoke]

--smoke: one tiny shape per dtype, one timed call (bench/smoke.py); without a GPU, the kernels
run on CPU tensors in Triton's interpreter and SDPA on the CPU.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import smoke  # before the kernels are decorated
from sexpgpu.backends.cuda.codegen import attention as kernels
from sexpgpu.backends.cuda.codegen.attention import (run_backward_kv, run_backward_q, run_backward_q_from_ds,
                                                     run_forward, run_row_delta, run_score_delta)


def fused(q, k, v, g, causal: bool, ds_in_memory: bool = True):
    """(out, dq, dk, dv) of the fused kernels."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    lead = q.shape[:-1]
    out, lse, delta = torch.empty_like(q), q.new_empty(lead, dtype=torch.float32), q.new_empty(lead, dtype=torch.float32)
    run_forward(q, k, v, out, lse, scale, causal)
    if kernels.delta_from_products(q.dtype == torch.bfloat16):
        run_score_delta(q, k, v, g, lse, delta, scale, causal)
    else:
        run_row_delta(out, g, delta)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if ds_in_memory and kernels.fused(q.shape[-1], v.shape[-1], q.dtype == torch.bfloat16):
        ds = q.new_empty(lead + (k.shape[-2],))
        run_backward_kv(q, k, v, g, lse, delta, dk, dv, scale, causal, ds)
        run_backward_q_from_ds(ds, k, dq, scale, causal)
    else:
        run_backward_kv(q, k, v, g, lse, delta, dk, dv, scale, causal)
        run_backward_q(q, k, v, g, lse, delta, dq, scale, causal)
    return out, dq, dk, dv


def reference(q, k, v, g, causal: bool):
    """float64 autograd through softmax(q k^T * scale) v."""
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
    out.backward(g.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


def errors(shape, dtype, causal: bool, device: str = "cuda") -> dict:
    generator = torch.Generator(device=device).manual_seed(1)
    q, k, v, g = (torch.randn(shape, device=device, generator=generator).to(dtype) for _ in range(4))
    got, again = fused(q, k, v, g, causal), fused(q, k, v, g, causal)
    recomputed = fused(q, k, v, g, causal, ds_in_memory=False)
    same = all(torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                           b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32)) for a, b in zip(got, again))
    want = reference(q, k, v, g, causal)
    found = {name: float((a.double() - b).abs().max() / b.abs().max()) for name, a, b in zip(("out", "dq", "dk", "dv"), got, want)}
    apart = {f"{name} vs recomputed": float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))
             for name, a, b in zip(("dq", "dk", "dv"), got[1:], recomputed[1:])}
    return dict(found, same_bits=same, **apart)


def milliseconds(call, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    if not torch.cuda.is_available():  # a smoke run on CPU tensors
        started = time.perf_counter()
        for _ in range(repeats):
            call()
        return (time.perf_counter() - started) * 1e3 / repeats
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        call()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / repeats


def timings(shape, dtype, repeats: int, device: str = "cuda", warmup: int = 3) -> dict:
    q, k, v, g = (torch.randn(shape, device=device).to(dtype) for _ in range(4))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def sdpa():
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
        out.backward(g)

    return {"fused fwd+bwd ms (dS in memory)": milliseconds(lambda: fused(q, k, v, g, True), repeats, warmup),
            "fused fwd+bwd ms (backward_q recomputing)": milliseconds(lambda: fused(q, k, v, g, True, False),
                                                                      repeats, warmup),
            "sdpa fwd+bwd ms": milliseconds(sdpa, repeats, warmup)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="32,8,512,64")
    parser.add_argument("--repeats", type=int, default=20)
    smoke.add_option(parser)
    args = parser.parse_args()
    shape = tuple(int(size) for size in args.shape.split(","))
    cases = (((2, 3, 257, 64), True), ((2, 3, 200, 20), False), ((1, 2, 333, 128), True), ((2, 2, 100, 256), False))
    device, warmup = "cuda", 3
    if args.smoke:
        cases, shape, args.repeats, warmup = (((1, 1, 5, 4), True),), (1, 1, 6, 4), 1, 0
        device = "cuda" if smoke.gpu() else "cpu"
    for dtype in (torch.float32, torch.bfloat16):
        for test_shape, causal in cases:
            print(f"{str(dtype):15} {test_shape} causal={causal}: {errors(test_shape, dtype, causal, device)}")
        print(f"{str(dtype):15} {shape}: {timings(shape, dtype, args.repeats, device, warmup)}")


if __name__ == "__main__":
    main()
