"""CUDA: det_gemm's fast path (its default, whose first stage is the residue product on int8
tensor cores from residue_stage.MIN_K and MIN_ROWS on, the float64 product below; the residue
product at every shape; the float64 product forced; int8 tensor-core tiers and fp64 tiers on cuBLAS)
gives the same bits as the exact accumulator (int8 planes) and the Triton Kulisch kernel, on
millions of outputs of random and adversarial data, bf16 and f32, some with inf and NaN.
Prints the counts.

    EXACT_ROUNDED_OUTPUTS=4000000 PYTHONPATH=src python -m pytest tests/exact/test_exact_rounded_gpu.py -s
"""

import contextlib
import os
from collections import Counter
from unittest import mock

import pytest
import torch

from exact_oracle import same_bits
from sexpgpu.exact import det_gemm
from sexpgpu.exact import implementations
from sexpgpu.exact import bounded_gemm, residue_stage
from sexpgpu.exact.gemm import accumulate_planes
from sexpgpu.exact.rounding import round_planes
from test_exact_crosscheck_gpu import cases

pytestmark = pytest.mark.gpu

OUTPUTS = int(os.environ.get("EXACT_ROUNDED_OUTPUTS", "4000000"))
PATHS = ("default", "residues", "float64", "int8", "fp64")  # det_gemm unforced, residues at every K, each forced path


def path(products):
    if products == "default":
        return contextlib.nullcontext()
    if products == "residues":  # the cases' shapes are mostly below MIN_K and MIN_ROWS
        return mock.patch.multiple(residue_stage, MIN_K=1, MIN_ROWS=1)
    return bounded_gemm.forced(products)


def exact_with(name, x, w):
    with implementations.forced(name):
        return round_planes(accumulate_planes(x, w), torch.float32)


def test_fast_path_equals_the_accumulators_on_millions_of_outputs():
    assert torch.cuda.is_available()
    generator = torch.Generator().manual_seed(29)
    compared, mismatched, fallback, tiers, calls = Counter(), Counter(), Counter(), Counter(), 0
    for kind, dtype, x, w in cases(generator):
        if sum(compared.values()) >= OUTPUTS:
            break
        planes = exact_with("int8", x, w)
        kulisch = exact_with("triton", x, w)
        assert same_bits(planes, kulisch)
        for products in PATHS:
            with path(products):
                fast = det_gemm(x, w)
            stats = bounded_gemm.last_statistics
            mismatched[products] += int((~same_elementwise(fast, planes)).sum())
            fallback[products] += stats.fallback
            tiers[products] += stats.tiers
        compared[f"{kind}, {dtype}"] += planes.numel()
        calls += 1
    total = sum(compared.values())
    print(f"\nfast path: {calls} GEMMs, {total} outputs, each compared with the int8 planes and the Triton kernel")
    for label, count in sorted(compared.items()):
        print(f"  {label:<40} {count:>10} outputs")
    for products in PATHS:
        print(f"  {products} tiers: {tiers[products] / calls:.1f} tiers a call, {fallback[products]} outputs "
              f"({fallback[products] / total:.3%}) to the exact accumulator, {mismatched[products]} mismatched")
    assert sum(mismatched.values()) == 0


def same_elementwise(a, b):
    both_nan = torch.isnan(a) & torch.isnan(b)
    return (a.view(torch.int32) == b.view(torch.int32)) | both_nan


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_randn_8192_settles_and_equals_the_planes(dtype):
    generator = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4096, 8192, device="cuda", generator=generator).to(dtype)
    w = torch.randn(4096, 8192, device="cuda", generator=generator).to(dtype)
    fast = det_gemm(x, w)
    stats = bounded_gemm.last_statistics
    print(f"\n{dtype} randn 4096x4096x8192: {stats}")
    assert bool(same_elementwise(fast, exact_with("int8", x, w)).all())
    assert stats.fallback < 0.001 * stats.outputs
