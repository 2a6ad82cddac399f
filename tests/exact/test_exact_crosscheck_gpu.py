"""CUDA: every implementation gives the same digits on millions of outputs of random and
adversarial data, bf16 and f32, some with inf and NaN. Prints the counts.

    EXACT_CROSSCHECK_OUTPUTS=4000000 PYTHONPATH=src python -m pytest tests/exact/test_exact_crosscheck_gpu.py -s
"""

import os
from collections import Counter

import pytest
import torch

from adversarial import KINDS
from sexpgpu.exact import det_gemm_partial
from sexpgpu.exact import implementations

pytestmark = pytest.mark.gpu

IMPLEMENTATIONS = ["int8", "triton", "fp64", "sliced"]
OUTPUTS = int(os.environ.get("EXACT_CROSSCHECK_OUTPUTS", "4000000"))


def with_specials(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    t = t.clone()
    flat = t.view(-1)
    spots = torch.randint(0, flat.numel(), (3,), generator=generator)
    for spot, value in zip(spots.tolist(), (float("inf"), float("-inf"), float("nan"))):
        flat[spot] = value
    return t


def cases(generator: torch.Generator):
    index = 0
    while True:
        kind = sorted(KINDS)[index % len(KINDS)]
        dtype = (torch.float32, torch.bfloat16)[(index // len(KINDS)) % 2]
        m, n = (int(v) for v in torch.randint(17, 600, (2,), generator=generator))
        k = int(torch.randint(1, 5000, (1,), generator=generator))
        x, w = KINDS[kind](m, n, k, dtype, generator)
        if index % 3 == 2:
            x, w = with_specials(x, generator), with_specials(w, generator)
        yield kind, dtype, x.cuda(), w.cuda()
        index += 1


def digits(name, x, w):
    with implementations.forced(name):
        return det_gemm_partial(x, w).digits


def test_implementations_agree_on_millions_of_outputs():
    assert torch.cuda.is_available()
    generator = torch.Generator().manual_seed(13)
    compared, mismatched, calls = Counter(), Counter(), 0
    for kind, dtype, x, w in cases(generator):
        if sum(compared.values()) >= OUTPUTS:
            break
        reference = digits("int8", x, w)
        for name in IMPLEMENTATIONS[1:]:
            other = digits(name, x, w)
            mismatched[name] += int((other != reference).any(0).sum())
        compared[f"{kind}, {dtype}"] += reference.shape[1] * reference.shape[2]
        calls += 1
    print(f"\ncross-check: {calls} GEMMs, {sum(compared.values())} outputs, each compared int8 vs "
          f"{', '.join(IMPLEMENTATIONS[1:])}")
    for label, count in sorted(compared.items()):
        print(f"  {label:<40} {count:>10} outputs")
    print(f"  mismatched outputs: {dict(mismatched)}")
    assert sum(mismatched.values()) == 0
