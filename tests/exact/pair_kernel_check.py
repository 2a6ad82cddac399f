"""Run under TRITON_INTERPRET=1: pair_kernel's lane sums, combined and bounded as on CUDA, hold
inequality (2) of pair_sums.py against the Fraction oracle, and settle to the exact rounding.

Prints one line per case and exits non-zero on the first failure. Shapes stay tiny: the
interpreter is slow. K below, at and beyond BLOCK_K, and more pairs than one program takes.
"""

import os
import sys
from fractions import Fraction

assert os.environ.get("TRITON_INTERPRET") == "1", "run me with TRITON_INTERPRET=1"

import torch  # noqa: E402

from adversarial import KINDS  # noqa: E402
from exact_oracle import BINARY32, oracle_gemm  # noqa: E402
from sexpgpu.exact import pair_kernel  # noqa: E402
from sexpgpu.exact.float64_stage import upper_norms  # noqa: E402
from sexpgpu.exact.pair_sums import combined, with_bound  # noqa: E402
from sexpgpu.exact.rounded import settle  # noqa: E402


def cases():
    for k, kind, dtype in [(5, "randn", torch.float32), (64, "cancellation", torch.float32),
                           (150, "whole range in a row", torch.bfloat16), (97, "subnormals", torch.float32)]:
        generator = torch.Generator().manual_seed(k)
        yield f"{kind}, K={k}, {dtype}", *KINDS[kind](3, 7, k, dtype, generator)


def check(name, x, w) -> bool:
    rows = torch.arange(x.shape[0]).repeat_interleave(w.shape[0])
    cols = torch.arange(w.shape[0]).repeat(x.shape[0])  # 21 pairs: more than one program's BLOCK_P
    magnitude = upper_norms(x.double())[rows] * upper_norms(w.double())[cols]
    result, bound = with_bound(combined(*pair_kernel.lane_sums(x, w, rows, cols)), magnitude)
    xs, ws = x.double().tolist(), w.double().tolist()
    for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        exact = sum((Fraction(a) * Fraction(b) for a, b in zip(xs[r], ws[c])), Fraction(0))
        if abs(Fraction(result[i].item()) - exact) > Fraction(bound[i].item()):
            print(f"outside the bound: {name}, output {r}, {c}")
            return False
    done, value = settle(result, bound, torch.ones((), dtype=torch.float64), torch.float32)
    expected = oracle_gemm(x, w, BINARY32).flatten()
    if not torch.equal(value[done].view(torch.int32), expected[done].view(torch.int32)):
        print(f"settled to another value: {name}")
        return False
    print(f"within the bound: {name} ({int(done.sum())} of {done.numel()} settled)")
    return True


if not all(check(*case) for case in cases()):
    sys.exit(1)
