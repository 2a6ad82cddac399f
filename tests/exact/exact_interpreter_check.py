"""Run under TRITON_INTERPRET=1: the Triton kernel's digits against the reference implementation's.

Prints one line per case and exits non-zero on the first difference. Blocks larger than the
outputs make every launch mask its edges; one case runs small blocks, a grid of programs.
The interpreter takes about a millisecond per call of a helper inside the kernel, so the
shapes stay tiny.
"""

import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run me with TRITON_INTERPRET=1"

import torch  # noqa: E402

from exact_random import random_cuts, wide_random  # noqa: E402
from sexpgpu.exact import det_combine, det_gemm_partial
from sexpgpu.exact import implementations  # noqa: E402
from sexpgpu.exact import triton_kernel  # noqa: E402

def cases():
    generator = torch.Generator().manual_seed(31)
    for dtype in (torch.float32, torch.bfloat16):
        x, w = wide_random((6, 7), dtype, generator, 140), wide_random((3, 7), dtype, generator, 140)
        yield f"{dtype} wide exponents", x, w
    tiny, huge = 2.0**-149, 3.0e38
    x = torch.tensor([[tiny, -tiny, huge, -0.0, 1.0, 2.0**-126], [huge, huge, huge, 1.0, -1.0, 0.5]])
    w = torch.tensor([[tiny, tiny, huge, 5.0, 2.0**-24, -tiny], [huge, -huge, 1.0, 0.0, 1.0, 2.0**100]])
    yield "subnormals, extremes, cancellation", x, w
    x[0, 0], w[1, 3] = float("nan"), float("inf")
    yield "NaN and infinity", x, w
    yield "transposed strides", x.t().contiguous().t(), w


def triton_digits(x, w, block=(8, 4), parts=1):
    triton_kernel.BLOCK_M, triton_kernel.BLOCK_N = block
    bounds = [0, *random_cuts(x.shape[1], parts, torch.Generator().manual_seed(1)), x.shape[1]]
    with implementations.forced("triton"):
        return det_combine([det_gemm_partial(x[:, a:b], w[:, a:b]) for a, b in zip(bounds, bounds[1:])]).digits


def main() -> int:
    checks = [(name, x, w, {}) for name, x, w in cases()]
    x, w = checks[0][1][:, :4], checks[0][2][:, :4]
    checks.append(("a grid of 2 x 2 programs", x, w, {"block": (4, 2)}))
    checks.append(("three uneven K-shards", checks[0][1], checks[0][2], {"parts": 3}))
    for name, x, w, options in checks:
        with implementations.forced("bins"):
            expected = det_gemm_partial(x, w).digits
        same = torch.equal(triton_digits(x, w, **options), expected)
        print(f"{'same' if same else 'DIFFERENT'}: {name}", flush=True)
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
