"""Throughput of sexpgpu.numerics against its peers, measured in the same run.

GPU: GB/s (bytes read and written) of every function and draw, against torch's float32
function of the same name and against torch.exp and against the same function built from the portable code alone (the
build before numerics/triton_exact.py), and of normal/uniform against torch.randn/torch.rand,
on the same tensors. CPU: elements per second of the numpy path
against numpy's float32 ufuncs and Generator. The goal on the GPU is at least 0.5x torch.

    PYTHONPATH=src python bench/bench_numerics.py [--gpu-elements N] [--cpu-elements M] [--smoke]

--smoke: a few hundred elements, one timed call each (bench/smoke.py); without a GPU the GPU
table's kernels run on CPU tensors in Triton's interpreter, against torch on the CPU.
"""

import argparse
import statistics
import time

import numpy as np

import smoke
from sexpgpu import numerics as nx

FUNCTIONS = ("exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "cos", "sin", "rsqrt",
             "pow")
KEY = nx.stream_key(1, "bench")


def gpu_seconds(fn, repeat=10):
    import torch

    if not torch.cuda.is_available():  # a smoke run's kernels on CPU tensors, in Triton's interpreter
        return cpu_seconds(fn, repeat)
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(times)


def cpu_seconds(fn, repeat=3):
    fn()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def torch_peer(torch, name, x, y):
    if name == "pow":
        return lambda: torch.pow(x, y)
    return lambda: getattr(torch, name)(x)


def call_ours(name, x, y):
    if x.device.type == "cpu":  # the kernels themselves (nx takes its numpy path for CPU tensors)
        from sexpgpu.numerics import cuda

        return cuda.binary(f"{name}_f32", x, y) if name == "pow" else cuda.unary(f"{name}_f32", x)
    return nx.pow(x, y) if name == "pow" else getattr(nx, name)(x)


def bench_gpu(n, functions=FUNCTIONS, draws=True, device="cuda", repeat=10):
    """GB/s of each function, of the same function as the portable build alone (before
    numerics/triton_exact.py and the midpoint-gated table reads: `portable`), and of torch."""
    import torch

    from sexpgpu.numerics import cuda

    x = torch.rand(n, device=device) * 4 + 0.1
    y = torch.rand(n, device=device) * 4 - 2
    exp_gbs = 8 * n / gpu_seconds(lambda: torch.exp(x), repeat) / 1e9
    where = torch.cuda.get_device_name() if device == "cuda" else "none (CPU tensors, Triton's interpreter)"
    print(f"GPU {where}, {n} float32 elements; torch.exp {exp_gbs:.0f} GB/s")
    print(f"{'function':18s} {'ours GB/s':>10s} {'portable':>9s} {'speedup':>8s} {'torch GB/s':>11s} "
          f"{'ours/torch':>11s} {'ours/exp':>9s}")
    for name in functions:
        nbytes = (12 if name == "pow" else 8) * n
        new = nbytes / gpu_seconds(lambda: call_ours(name, x, y), repeat) / 1e9
        with cuda.portable_build():
            old = nbytes / gpu_seconds(lambda: call_ours(name, x, y), repeat) / 1e9
        peer = nbytes / gpu_seconds(torch_peer(torch, name, x, y), repeat) / 1e9
        print(f"{name:18s} {new:10.0f} {old:9.0f} {new / old:8.2f} {peer:11.0f} {new / peer:11.2f} "
              f"{new / exp_gbs:9.2f}")
    if draws:
        bench_draws(n, device, repeat)


def bench_draws(n, device="cuda", repeat=10):
    import torch

    draws = {
        "uniform": (lambda: nx.uniform(KEY, n, device=device), lambda: torch.rand(n, device=device), 4),
        "normal": (lambda: nx.normal(KEY, n, device=device), lambda: torch.randn(n, device=device), 4),
        "truncated_normal": (lambda: nx.truncated_normal(KEY, n, device=device),
                             lambda: torch.randn(n, device=device), 4),
        "bernoulli": (lambda: nx.bernoulli(KEY, n, 0.5, device=device),
                      lambda: torch.empty(n, dtype=torch.bool, device=device).bernoulli_(0.5), 1),
        "randint": (lambda: nx.randint(KEY, n, 0, 1000, device=device),
                    lambda: torch.randint(0, 1000, (n,), dtype=torch.int32, device=device), 4),
    }
    print(f"{'draw':18s} {'ours GB/s':>10s} {'torch GB/s':>11s} {'ours/torch':>11s}   peer")
    peers = {"uniform": "torch.rand", "normal": "torch.randn", "truncated_normal": "torch.randn",
             "bernoulli": "bernoulli_", "randint": "torch.randint"}
    for name, (ours_fn, peer_fn, width) in draws.items():
        ours = width * n / gpu_seconds(ours_fn, repeat) / 1e9
        peer = width * n / gpu_seconds(peer_fn, repeat) / 1e9
        print(f"{name:18s} {ours:10.0f} {peer:11.0f} {ours / peer:11.2f}   {peers[name]}")


def bench_launch_shapes(n):
    """GB/s of a few kernels under other block sizes, to choose cuda.BLOCK and NUM_WARPS."""
    import torch

    from sexpgpu.numerics import cuda

    x = torch.rand(n, device="cuda") * 4 + 0.1
    saved = cuda.BLOCK, cuda.NUM_WARPS
    print("launch shapes (GB/s): block, warps -> exp erf pow normal")
    for block, warps in [(256, 4), (512, 4), (1024, 4), (1024, 8)]:
        cuda.BLOCK, cuda.NUM_WARPS = block, warps
        row = [8 * n / gpu_seconds(lambda: nx.exp(x), 5), 8 * n / gpu_seconds(lambda: nx.erf(x), 5),
               12 * n / gpu_seconds(lambda: nx.pow(x, x), 5),
               4 * n / gpu_seconds(lambda: nx.normal(KEY, n, device="cuda"), 5)]
        print(f"  {block:5d} {warps:2d} -> " + " ".join(f"{v / 1e9:6.0f}" for v in row))
    cuda.BLOCK, cuda.NUM_WARPS = saved


def bench_cpu(m, repeat=3):
    rng = np.random.default_rng(0)
    x = (rng.random(m, dtype=np.float32) * 4 + 0.1).astype(np.float32)
    y = (rng.random(m, dtype=np.float32) * 4 - 2).astype(np.float32)
    peers = {"exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "tanh": np.tanh,
             "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "cos": np.cos, "sin": np.sin,
             "rsqrt": lambda v: 1 / np.sqrt(v), "pow": None}
    print(f"CPU (numpy path, one thread), {m} float32 elements")
    print(f"{'function':18s} {'ours M/s':>10s} {'numpy M/s':>10s} {'ours/numpy':>11s}")
    for name in FUNCTIONS:
        ours = m / cpu_seconds(lambda: nx.pow(x, y) if name == "pow" else getattr(nx, name)(x), repeat) / 1e6
        peer_fn = peers.get(name)
        if name == "pow":
            peer_fn = lambda v: np.power(v, y)  # noqa: E731
        if peer_fn is None:
            print(f"{name:18s} {ours:10.1f} {'-':>10s} {'-':>11s}")
            continue
        peer = m / cpu_seconds(lambda: peer_fn(x), repeat) / 1e6
        print(f"{name:18s} {ours:10.1f} {peer:10.1f} {ours / peer:11.3f}")
    for name, ours_fn, peer_fn in [
            ("uniform", lambda: nx.uniform(KEY, m), lambda: rng.random(m, dtype=np.float32)),
            ("normal", lambda: nx.normal(KEY, m), lambda: rng.standard_normal(m, dtype=np.float32))]:
        ours, peer = m / cpu_seconds(ours_fn, repeat) / 1e6, m / cpu_seconds(peer_fn, repeat) / 1e6
        print(f"{name:18s} {ours:10.1f} {peer:10.1f} {ours / peer:11.3f}   (numpy Generator)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu-elements", type=int, default=1 << 28)
    parser.add_argument("--cpu-elements", type=int, default=1 << 22)
    parser.add_argument("--launch-shapes", action="store_true")
    smoke.add_option(parser)
    args = parser.parse_args()
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if args.smoke:
        bench_gpu(1 << 8, device="cuda" if has_cuda else "cpu", repeat=1)
        if args.launch_shapes:
            smoke.skipped("--launch-shapes", "it chooses launch shapes for a GPU")
        bench_cpu(1 << 10, repeat=1)
        return
    if has_cuda:
        bench_gpu(args.gpu_elements)
        if args.launch_shapes:
            bench_launch_shapes(args.gpu_elements)
    else:
        print("no CUDA device: GPU figures skipped")
    bench_cpu(args.cpu_elements)


if __name__ == "__main__":
    main()
