"""Run under TRITON_INTERPRET=1: the CUDA kernels of det_gemm's float64 stages on the CPU.

- pair_kernel's lane sums, combined and bounded as on CUDA, hold inequality (2) of
  pair_sums.py against the Fraction oracle, and settle to the exact rounding;
- settle_kernel gives rounded.settle's outputs for float32, bit for bit, on totals at and
  around rounding boundaries, zeros, subnormals and the overflow point;
- triton_kernel.accumulate_pairs gives the reference implementation's digits for listed outputs.

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
from sexpgpu.exact import pair_kernel, settle_kernel, triton_kernel
from sexpgpu.exact import implementations  # noqa: E402
from sexpgpu.exact.float64_stage import float64_product, upper_norms  # noqa: E402
from sexpgpu.exact.gemm import accumulate_planes  # noqa: E402
from sexpgpu.exact.pair_sums import combined, with_bound  # noqa: E402
from sexpgpu.exact.bounded_gemm import settle  # noqa: E402


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


def settle_cases():
    generator = torch.Generator().manual_seed(5)
    x, w = torch.randn(5, 40, generator=generator), torch.randn(70, 40, generator=generator)
    yield "randn", float64_product(x, w)
    first = float64_product(x[:, :3], w[:, :3])
    one = torch.tensor([1.0, 1.0 + 2.0**-24, 2.0**-149, 2.0**-150, 3.4028234663852886e38, 2.0**128, 0.0, -1.5])
    first.total = (one[:, None] * (1 + torch.arange(-3, 67, dtype=torch.float64) * 2.0**-53)[None, :])
    first.x_norm = torch.tensor([0.0, 2.0**-80, 2.0**-60, 1.0, 2.0**-200, 2.0**-30, 1.0, 2.0**-40], dtype=torch.float64)
    first.w_norm = torch.rand(70, generator=generator, dtype=torch.float64)
    yield "boundaries", first


def check_settle(name, first) -> bool:
    done, value = settle_kernel.settle_float32(first.total, first.x_norm, first.w_norm, first.factor)
    expected_done, expected = settle(first.total, first.bound(), torch.ones((), dtype=torch.float64), torch.float32)
    expected = torch.where(expected_done, expected, torch.zeros(()))
    if not (torch.equal(done, expected_done) and torch.equal(value.view(torch.int32), expected.view(torch.int32))):
        print(f"settled otherwise than rounded.settle: {name}")
        return False
    print(f"settled as rounded.settle: {name} ({int(done.sum())} of {done.numel()})")
    return True


def check_pair_digits(name, x, w) -> bool:
    rows, cols = torch.tensor([2, 0, 1, 2]), torch.tensor([6, 0, 3, 1])
    with implementations.forced("bins"):
        expected = accumulate_planes(x, w)[:, rows, cols]
    got = triton_kernel.accumulate_pairs(x, w, rows, cols)
    from sexpgpu.exact.accumulator import normalise_
    if not torch.equal(normalise_(got), expected):
        print(f"other digits: {name}")
        return False
    print(f"same digits: {name}")
    return True


triton_kernel.PAIRS_BLOCK = 2  # several programs, the last one partly masked
triton_kernel.PAIRS_K_PART = 32  # several slabs of K, the last one short
triton_kernel.PAIRS_SLAB_ELEMENTS = 2 * 18 * 5  # several batches of outputs
results = [check(*case) for case in cases()]
results += [check_settle(*case) for case in settle_cases()]
results += [check_pair_digits(*case) for case in cases()]
if not all(results):
    sys.exit(1)
