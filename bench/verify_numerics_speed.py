"""The GPU build of sexpgpu.numerics against the portable build, bit for bit, then their speed.

    PYTHONPATH=src python3 bench/verify_numerics_speed.py [--functions exp,erf] [--skip-bench]
        [--launch-shapes]

The GPU build replaces a few portable functions by hardware conversions
(numerics/triton_exact.py) and reads the hard-case table only near a rounding midpoint.
The oracle is the previous build, compiled for the same GPU (cuda.portable_build(): the
portable code alone, every lane reading the table), whose bits the CPU path and the
exhaustive checks of tests/numerics/gpu_checks.py vouch for. Checked here, on the GPU:

1. every one of the 2^32 float32 inputs of each one-argument function, new against old;
2. pow on 2^26 random pairs (half of them moderate) and on every pair of special values,
   new against old, and 2^20 random pairs against the CPU path;
3. each draw (uniform, normal, truncated normal, bernoulli, randint) over several keys;
4. 2^20 random inputs of each function against the CPU path.

Each check prints PASS or FAIL, and a summary line says ALL PASS or names the failures; then
bench_numerics.py's GPU table (new, portable build, torch) on 2^28 elements, and the summary
again. `--smoke` runs the same checks on tiny sizes, and without a GPU on CPU tensors in
Triton's interpreter (bench/smoke.py), without the draws, which take the numpy path there.
"""

import argparse
import pathlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import smoke  # noqa: E402  (before the kernels are decorated)
import bench_numerics  # noqa: E402

from sexpgpu import numerics as nx  # noqa: E402
from sexpgpu.numerics import cuda  # noqa: E402

UNARY = ("exp", "erf", "tanh", "sigmoid", "log", "expm1", "log1p", "cos", "sin", "rsqrt")
# sizes; --smoke shrinks them to run this script's logic on the CPU in Triton's interpreter
size = {"device": "cuda", "chunk": 1 << 28, "stride": 1, "pairs": 1 << 26, "cpu": 1 << 20,
        "draws": 1 << 24}
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 0.1, -0.1, 10.0, 1e-3,
                    16777216.0, -16777217.0, 1e10, -1e10, 88.7, -103.9, 3.4028235e38,
                    -3.4028235e38, 1.1754944e-38, 1e-45, -1e-45, 5.877472e-39, np.inf, -np.inf,
                    np.nan, 0.99999994, 1.0000001, 7.0, -7.0, 11.0, 0.25, 4.0, 127.0, -149.0,
                    128.0, -126.0], dtype=np.float32)
failures = []


def verdict(what, differing, detail=""):
    print(f"{'PASS' if differing == 0 else 'FAIL'} {what}: {differing} differing {detail}", flush=True)
    if differing:
        failures.append(what)


def both_builds(fn):
    """fn() under the GPU build and under the portable build."""
    new = fn()
    with cuda.portable_build():
        old = fn()
    return new, old


def kernel(name, *args):
    """The current build's kernel for `name` on tensors of size["device"] (CPU tensors
    too, in the interpreter, where nx.exp would take the numpy path)."""
    if len(args) == 2:
        return cuda.binary(f"{name}_f32", *args)
    return cuda.unary(f"{name}_f32", args[0])


def exhaustive(name):
    began = time.time()
    differing, examples = 0, []
    chunk, stride = size["chunk"], size["stride"]
    for start in range(0, 1 << 32, chunk * stride):
        bits = torch.arange(start, start + chunk * stride, stride, dtype=torch.int64,
                            device=size["device"]).to(torch.int32)
        new, old = both_builds(lambda: kernel(name, bits.view(torch.float32)))
        bad = new.view(torch.int32) != old.view(torch.int32)
        count = int(bad.sum())
        differing += count
        if count and len(examples) < 5:
            examples += [hex(b & 0xFFFFFFFF) for b in bits[bad][:5].tolist()]
    what = "all 2^32 inputs" if stride == 1 else f"every {stride}th input"
    verdict(f"{name} {what}, new vs portable build", differing,
            f"{examples} ({time.time() - began:.1f}s)")


def random_pairs(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    y = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[: n // 2] = (2.0 ** rng.uniform(-20, 20, n // 2)).astype(np.float32)
    y[: n // 2] = rng.uniform(-30, 30, n // 2).astype(np.float32)
    return x, y


def pow_checks():
    x, y = random_pairs(size["pairs"], 1)
    gx, gy = torch.from_numpy(x).to(size["device"]), torch.from_numpy(y).to(size["device"])
    new, old = both_builds(lambda: kernel("pow", gx, gy))
    verdict(f"pow {len(x)} random pairs, new vs portable build",
            int((new.view(torch.int32) != old.view(torch.int32)).sum()))
    sx = torch.from_numpy(np.repeat(SPECIAL, len(SPECIAL))).to(size["device"])
    sy = torch.from_numpy(np.tile(SPECIAL, len(SPECIAL))).to(size["device"])
    new, old = both_builds(lambda: kernel("pow", sx, sy))
    verdict(f"pow all {sx.numel()} pairs of special values, new vs portable build",
            int((new.view(torch.int32) != old.view(torch.int32)).sum()))
    n = size["cpu"]
    gpu = kernel("pow", gx[:n].contiguous(), gy[:n].contiguous()).cpu().numpy().view(np.uint32)
    with np.errstate(all="ignore"):
        cpu = nx.pow(x[:n], y[:n]).view(np.uint32)
    verdict(f"pow {n} random pairs, GPU vs CPU", int(np.sum(gpu != cpu)))


def draw_checks():
    shape, device = (size["draws"],), torch.device(size["device"])
    calls = {
        "uniform": lambda key: nx.uniform(key, shape, low=-2.0, high=3.0, device=device),
        "normal": lambda key: nx.normal(key, shape, mean=0.5, std=2.0, device=device),
        "truncated_normal": lambda key: nx.truncated_normal(key, shape, mean=-1.0, std=0.1,
                                                            bound=1.0, device=device),
        "bernoulli": lambda key: nx.bernoulli(key, shape, p=0.1, device=device),
        "randint": lambda key: nx.randint(key, shape, low=-(2**31), high=2**31, device=device),
    }
    for name, call in calls.items():
        differing = 0
        for j in range(4):
            key = nx.fold_in(nx.stream_key(20261129 + j, f"verify/{name}"), j)
            new, old = both_builds(lambda: call(key))
            differing += int((new != old).sum())
        verdict(f"{name} 4 keys x {shape[0]} draws, new vs portable build", differing)


def cpu_checks(names):
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, size["cpu"], dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    for name in names:
        with np.errstate(all="ignore"):
            cpu = getattr(nx, name)(x).view(np.uint32)
        gpu = kernel(name, torch.from_numpy(x).to(size["device"])).cpu().numpy().view(np.uint32)
        verdict(f"{name} {len(x)} random inputs, GPU vs CPU", int(np.sum(cpu != gpu)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--functions", default=",".join(UNARY))
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--launch-shapes", action="store_true",
                        help="also GB/s of exp, erf, pow and normal under other block sizes")
    smoke.add_option(parser)
    args = parser.parse_args()
    names = [n for n in args.functions.split(",") if n]
    began = time.time()
    if args.smoke:
        size.update(device="cuda" if smoke.gpu() else "cpu", chunk=1 << 8, stride=1 << 24, pairs=1 << 8,
                    cpu=1 << 8, draws=1 << 10)
        args.skip_bench = True
    else:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name in names:
        exhaustive(name)
    pow_checks()
    if size["device"] == "cuda":
        draw_checks()
    else:
        smoke.skipped("the draws' checks", "on CPU tensors the draws take the numpy path, not the kernels")
    cpu_checks(names)
    print(f"checks took {time.time() - began:.0f}s", flush=True)
    print("ALL PASS" if not failures else f"FAILED: {failures}", flush=True)
    if not args.skip_bench:
        bench_numerics.bench_gpu(1 << 28, tuple(names) + ("pow",), draws=False)
        if args.launch_shapes:
            bench_numerics.bench_launch_shapes(1 << 28)
        print("ALL PASS" if not failures else f"FAILED: {failures}", flush=True)


if __name__ == "__main__":
    main()
