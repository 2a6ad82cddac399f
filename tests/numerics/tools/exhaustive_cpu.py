"""Dev-time check of the numpy path against x87 long double, over a stride of inputs.

For each function, every `stride`-th float32 bit pattern (all of them with --stride 1) is
evaluated by the portable algorithm and by longdouble_ref.c. It reports the inputs whose
float32 results differ where the long double decides the rounding, lists the inputs the
long double cannot decide (to be checked with mpmath by check_candidates.py), and the
largest error of the float64 value before its rounding, in float64 ulps.

    gcc -O2 -shared -fPIC -o /tmp/libref.so tests/numerics/tools/longdouble_ref.c -lm
    PYTHONPATH=src python tests/numerics/tools/exhaustive_cpu.py --lib /tmp/libref.so \
        --stride 16 --out /tmp/exhaustive exp log
"""

import argparse
import ctypes
import json
import pathlib

import numpy as np

from sexpgpu.numerics.portable import erf, exp, log, roots, tables, trig

FUNCTIONS = {
    "exp": (0, exp.exp_f32), "expm1": (1, exp.expm1_f32), "log": (2, log.log_f32),
    "log1p": (3, log.log1p_f32), "tanh": (4, exp.tanh_f32), "sigmoid": (5, exp.sigmoid_f32),
    "erf": (6, erf.erf_f32), "cos": (7, trig.cos_f32), "sin": (8, trig.sin_f32),
    "rsqrt": (9, roots.rsqrt_f32),
}
CHUNK = 1 << 20
PIECE = 1 << 14


def capture_rounding():
    """Make every round_f32 call record its float64 argument in captured[-1]."""
    captured = []
    original = exp.round_f32

    def recording(hi, lo):
        captured.append(np.array(hi, dtype=np.float64))
        return original(hi, lo)

    for module in (exp, log, trig):
        module.round_f32 = recording
    return captured


def evaluate(fn, bits, captured):
    outs, his = [], []
    for start in range(0, len(bits), PIECE):
        outs.append(fn(bits[start:start + PIECE], tables.TABLE))
        his.append(np.broadcast_to(captured.pop(), outs[-1].shape))
    return np.concatenate(outs), np.concatenate(his)


def check(name, lib, stride, offset, captured):
    index, fn = FUNCTIONS[name]
    report = {"function": name, "stride": stride, "offset": offset, "checked": 0,
              "mismatches": [], "unsure": [], "max_error_ulps": 0.0, "worst_input": None}
    for first in range(offset, 1 << 32, CHUNK * stride):
        bits = np.arange(first, min(first + CHUNK * stride, 1 << 32), stride,
                         dtype=np.uint64).astype(np.uint32)
        with np.errstate(all="ignore"):
            ours, hi = evaluate(fn, bits, captured)
        ref = np.empty_like(bits)
        unsure = np.empty(len(bits), dtype=np.uint8)
        err = np.empty(len(bits), dtype=np.float64)
        lib.reference(index, bits.ctypes.data, ref.ctypes.data, unsure.ctypes.data,
                      np.ascontiguousarray(hi).ctypes.data, err.ctypes.data, len(bits))
        report["checked"] += len(bits)
        bad = (ours != ref) & (unsure == 0)
        report["mismatches"] += [[int(b), int(o), int(r)] for b, o, r in
                                 zip(bits[bad], ours[bad], ref[bad])]
        report["unsure"] += [[int(b), int(o)] for b, o in zip(bits[unsure == 1], ours[unsure == 1])]
        worst = int(np.argmax(err))
        if err[worst] > report["max_error_ulps"]:
            report["max_error_ulps"] = float(err[worst])
            report["worst_input"] = int(bits[worst])
    return report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("functions", nargs="+", choices=sorted(FUNCTIONS))
    parser.add_argument("--lib", required=True)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lib = ctypes.CDLL(args.lib)
    lib.reference.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_long]
    captured = capture_rounding()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.functions:
        report = check(name, lib, args.stride, args.offset, captured)
        (out / f"{name}.json").write_text(json.dumps(report))
        print(name, report["checked"], "mismatches", len(report["mismatches"]), "unsure",
              len(report["unsure"]), "max error %.3f ulps at 0x%08x" % (
                  report["max_error_ulps"], report["worst_input"] or 0), flush=True)


if __name__ == "__main__":
    main()
