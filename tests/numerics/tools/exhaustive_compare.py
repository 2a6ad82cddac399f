"""Dev-time check: the numpy path of this tree against an earlier revision's, on every input.

    PYTHONPATH=src python tests/numerics/tools/exhaustive_compare.py --oracle REV exp erf

Every float32 bit pattern (or those from --first to --last) is evaluated by the portable
function of this tree and by the same function of revision REV (its portable/ folder,
taken with `git archive` and imported on its own, so both run side by side), and the
results are compared bit for bit. It prints, per function, the inputs compared, the
mismatches and the time, and writes the mismatches to OUT/NAME.txt.

With --no-table this tree's function runs without its hard-case table: the mismatches are
then the inputs whose float64 value rounds otherwise than the oracle's correctly rounded
result, which the table must answer. They are written as MISROUNDED lines (the distance d
of the exact value from a rounding midpoint, from mpmath, in float32 ulps) for
make_hardcases.py; even and odd functions by |x|.
"""

import argparse
import ctypes
import importlib
import io
import multiprocessing
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[3]
PORTABLE = "src/sexpgpu/numerics/portable"
FUNCTIONS = {"exp": ("exp", "exp_f32"), "expm1": ("exp", "expm1_f32"), "tanh": ("exp", "tanh_f32"),
             "sigmoid": ("exp", "sigmoid_f32"), "erf": ("erf", "erf_f32"), "log": ("log", "log_f32"),
             "log1p": ("log", "log1p_f32"), "cos": ("trig", "cos_f32"), "sin": ("trig", "sin_f32"),
             "rsqrt": ("roots", "rsqrt_f32")}
SYMMETRIC = ("cos", "erf", "sin", "tanh")
TASK = 1 << 24
PIECE = 1 << 14


def keep_freed_memory():
    """Have glibc's malloc keep freed blocks: the pieces' arrays, allocated and freed by the
    thousand, would otherwise cost a system call and fresh pages each (half the run time)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    for option, value in ((-1, 1 << 30), (-2, 1 << 27), (-3, 1 << 25)):  # trim, top pad, mmap
        libc.mallopt(option, value)


def extract(revision, folder):
    """REV's portable/ as the package `oracle_portable` under folder."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, PORTABLE],
                             capture_output=True, check=True).stdout
    target = pathlib.Path(folder) / "oracle_portable"
    target.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                # the oracle imports its own modules, not this tree's: its imports name the new package
                text = tar.extractfile(member).read().replace(b"sexpgpu.numerics.portable", b"oracle_portable")
                (target / pathlib.Path(member.name).name).write_bytes(text)


def functions(name, folder, table):
    """(this tree's function, its table), (the oracle's, its table)."""
    from sexpgpu.numerics.portable import exp, tables

    if not table:
        exp.hard_case = lambda bits, result, near, tab, spec: result
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module, fn = FUNCTIONS[name]
    ours = getattr(importlib.import_module(f"sexpgpu.numerics.portable.{module}"), fn)
    theirs = getattr(importlib.import_module(f"oracle_portable.{module}"), fn)
    return (ours, tables.TABLE), (theirs, importlib.import_module("oracle_portable.tables").TABLE)


def compare(task):
    name, folder, table, first, last = task
    (ours, our_table), (theirs, their_table) = functions(name, folder, table)
    differing = []
    with np.errstate(all="ignore"):
        for start in range(first, last, PIECE):
            bits = np.arange(start, min(start + PIECE, last), dtype=np.uint64).astype(np.uint32)
            bad = ours(bits, our_table) != theirs(bits, their_table)
            differing += [int(b) for b in bits[bad]]
    return last - first, differing


def misrounded_lines(name, bits):
    sys.path.insert(0, str(HERE.parents[1]))
    import numerics_reference as ref

    keys = sorted({b & 0x7FFFFFFF if name in SYMMETRIC else b for b in bits})
    for b in keys:
        d = ref.midpoint_distance(ref.exact(name, b))
        x = float(np.array([b], np.uint32).view(np.float32)[0])
        yield f"MISROUNDED {name} x={x.hex()} (0x{b:08x}) d=2^{float(ref.mp.log(d, 2)):.2f}\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("functions", nargs="+", choices=sorted(FUNCTIONS))
    parser.add_argument("--oracle", required=True, help="the revision whose results are right")
    parser.add_argument("--first", type=lambda s: int(s, 0), default=0)
    parser.add_argument("--last", type=lambda s: int(s, 0), default=1 << 32, help="exclusive")
    parser.add_argument("--no-table", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="/tmp/exhaustive_compare")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keep_freed_memory()
    with tempfile.TemporaryDirectory() as folder, multiprocessing.Pool(args.jobs) as pool:
        extract(args.oracle, folder)
        for name in args.functions:
            began = time.time()
            tasks = [(name, folder, not args.no_table, s, min(s + TASK, args.last))
                     for s in range(args.first, args.last, TASK)]
            checked, differing = 0, []
            for count, bad in pool.imap(compare, tasks):
                checked += count
                differing += bad
            seconds = time.time() - began
            lines = (misrounded_lines(name, differing) if args.no_table
                     else (f"0x{b:08x}\n" for b in differing))
            (out / f"{name}.txt").write_text("".join(lines))
            print(f"{name}: {checked} inputs compared with {args.oracle}"
                  f"{' (no hard-case table)' if args.no_table else ''}, {len(differing)} mismatches,"
                  f" {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
