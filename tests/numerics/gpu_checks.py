"""The GPU checks behind test_numerics_gpu.py, runnable without pytest on a GPU machine:

    PYTHONPATH=src python tests/numerics/gpu_checks.py REPORT.json

1. Every float32 input (all 2^32) of every function on the GPU against the same function
   in float64 from torch (CUDA's libdevice, errors of a few float64 ulps), rounded to
   float32. Where that float64 value lies within 16 float64 ulps of a float32 rounding
   midpoint the reference cannot decide; those inputs are compared with the CPU (numpy)
   path's bits and with mpmath's correctly rounded value.
2. Draws of every distribution on the GPU against the CPU path, bit for bit, over many
   keys and salts (>= 10^8 elements each), the CPU side in worker processes.
3. pow on random pairs and the raw generator, GPU against CPU.
"""

import concurrent.futures
import hashlib
import json
import math
import multiprocessing
import os
import pathlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sexpgpu import numerics as nx  # noqa: E402

MARGIN_ULPS = 16
REFERENCES = {
    "exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "cos": torch.cos,
    "sin": torch.sin, "rsqrt": torch.rsqrt,
}
QUIET_NAN = 0x7FC00000
FLT_MAX = 3.4028234663852886e38


def rounded_reference(r):
    """float32 bits (int32) of the float64 r rounded, and where that rounding is unsure."""
    f = r.float()
    want = torch.where(torch.isnan(r), torch.tensor(QUIET_NAN, dtype=torch.int32, device=r.device),
                       f.view(torch.int32))
    a = r.abs()
    fa = f.abs()
    below = torch.where(fa.double() > a, torch.nextafter(fa, torch.zeros_like(fa)), fa)
    up = torch.nextafter(below, torch.full_like(below, math.inf))
    ulp32 = torch.where(below == FLT_MAX, torch.full_like(a, 2.0**104), up.double() - below.double())
    ulp64 = a * 2.0**-52  # at least one float64 ulp of a, at most two
    unsure = torch.isfinite(a) & (a > 0) & ((a - (below.double() + ulp32 / 2)).abs() <= MARGIN_ULPS * ulp64)
    return want, unsure


def _mpmath_verdicts(name, bits):
    try:
        import numerics_reference as ref
    except ImportError:
        return None
    return [ref.correct(name, int(b)) for b in bits]


def exhaustive(name, device="cuda", chunk=1 << 28, start=0, stop=1 << 32):
    """Counts for all inputs in [start, stop): checked, mismatches, unsure and their checks."""
    fn, reference = getattr(nx, name), REFERENCES[name]
    report = {"function": name, "checked": 0, "mismatches": [], "unsure": 0,
              "unsure_cpu_equal": 0, "unsure_mpmath_equal": None, "unsure_wrong": []}
    unsure_bits = []
    unsure_ours = []
    for a in range(start, stop, chunk):
        bits = torch.arange(a, min(a + chunk, stop), dtype=torch.int64, device=device).to(torch.int32)
        ours = fn(bits.view(torch.float32)).view(torch.int32)
        want, unsure = rounded_reference(reference(bits.view(torch.float32).double()))
        bad = (ours != want) & ~unsure
        report["checked"] += bits.numel()
        report["mismatches"] += [[int(b) & 0xFFFFFFFF, int(o) & 0xFFFFFFFF, int(w) & 0xFFFFFFFF]
                                 for b, o, w in zip(bits[bad][:20].tolist(), ours[bad][:20].tolist(),
                                                    want[bad][:20].tolist())]
        unsure_bits.append(bits[unsure].cpu())
        unsure_ours.append(ours[unsure].cpu())
    ub = torch.cat(unsure_bits).numpy().view(np.uint32)
    uo = torch.cat(unsure_ours).numpy().view(np.uint32)
    report["unsure"] = len(ub)
    cpu = fn(ub.view(np.float32)).view(np.uint32)
    report["unsure_cpu_equal"] = int(np.sum(cpu == uo))
    verdicts = _mpmath_verdicts(name, ub)
    if verdicts is not None:
        right = np.array(verdicts, dtype=np.uint32) == uo
        report["unsure_mpmath_equal"] = int(right.sum())
        report["unsure_wrong"] = [int(b) for b in ub[~right][:20]]
    report["unsure_inputs"] = [int(b) for b in ub]
    return report


DISTRIBUTIONS = {
    "uniform": (nx.uniform, [{}, {"low": -2.0, "high": 3.0}]),
    "normal": (nx.normal, [{}, {"mean": 0.5, "std": 2.0}]),
    "truncated_normal": (nx.truncated_normal, [{}, {"mean": -1.0, "std": 0.1, "bound": 1.0}]),
    "bernoulli": (nx.bernoulli, [{"p": 0.5}, {"p": 0.1}]),
    "randint": (nx.randint, [{"low": 0, "high": 10}, {"low": -(2**31), "high": 2**31}]),
}


def draw_cases(name, keys, shape):
    """(key words, params) for `keys` streams: stream keys of several paths, half salted."""
    cases = []
    for j in range(keys):
        key = nx.stream_key(20261129 + j, f"gpu-check/{name}#{j}")
        if j % 2:
            key = nx.fold_in(key, j * 7919 - 3)
        cases.append((key.words, DISTRIBUTIONS[name][1][j % 2]))
    return cases


def _cpu_digest(task):
    name, words, params, shape = task
    out = DISTRIBUTIONS[name][0](nx.Key(*words), shape, **params)
    return hashlib.sha256(np.ascontiguousarray(out).tobytes()).hexdigest()


def draws_identity(name, device="cuda", keys=64, shape=(1600, 1000), workers=None):
    """GPU draws against the CPU path over `keys` streams; counts and any differing stream."""
    cases = draw_cases(name, keys, shape)
    tasks = [(name, words, params, shape) for words, params in cases]
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers or os.cpu_count(), mp_context=context) as pool:
        cpu_digests = list(pool.map(_cpu_digest, tasks))
    differing = []
    for (words, params), digest in zip(cases, cpu_digests):
        gpu = DISTRIBUTIONS[name][0](nx.Key(*words), shape, device=device, **params)
        if hashlib.sha256(gpu.cpu().numpy().tobytes()).hexdigest() != digest:
            differing.append([list(words), params])
    return {"distribution": name, "elements": keys * math.prod(shape), "streams": keys,
            "differing_streams": differing}


def pow_identity(device="cuda", n=1 << 24, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    y = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[: n // 2] = (2.0 ** rng.uniform(-20, 20, n // 2)).astype(np.float32)
    y[: n // 2] = rng.uniform(-30, 30, n // 2).astype(np.float32)
    gpu = nx.pow(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)).cpu().numpy()
    return {"pairs": n, "differing": int(np.sum(gpu.view(np.uint32) != nx.pow(x, y).view(np.uint32)))}


def philox_identity(device="cuda", n=1 << 22):
    rng = np.random.default_rng(2)
    c = rng.integers(0, 2**32, (n, 4), dtype=np.uint64).astype(np.uint32)
    k = rng.integers(0, 2**32, (n, 2), dtype=np.uint64).astype(np.uint32)
    gpu = nx.philox4x32(torch.from_numpy(c).to(device), torch.from_numpy(k).to(device))
    return {"blocks": n, "differing": int(np.sum(np.any(gpu.cpu().numpy() != nx.philox4x32(c, k), axis=1)))}


def main(report_path):
    report = {"device": torch.cuda.get_device_name(), "functions": {}, "draws": {}}
    path = pathlib.Path(report_path)

    def save():
        path.write_text(json.dumps(report, indent=1))

    for name in REFERENCES:
        began = time.time()
        report["functions"][name] = exhaustive(name)
        report["functions"][name]["seconds"] = round(time.time() - began, 1)
        r = report["functions"][name]
        print(name, r["checked"], "mismatches", len(r["mismatches"]), "unsure", r["unsure"],
              "cpu-equal", r["unsure_cpu_equal"], "mpmath-equal", r["unsure_mpmath_equal"],
              f"{r['seconds']}s", flush=True)
        save()
    for name in DISTRIBUTIONS:
        began = time.time()
        report["draws"][name] = draws_identity(name)
        print(name, report["draws"][name]["elements"], "differing streams",
              len(report["draws"][name]["differing_streams"]), f"{time.time() - began:.1f}s", flush=True)
        save()
    report["pow"] = pow_identity()
    report["philox"] = philox_identity()
    print("pow", report["pow"], "philox", report["philox"], flush=True)
    save()


if __name__ == "__main__":
    main(sys.argv[1])
