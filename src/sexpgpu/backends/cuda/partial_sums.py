"""The fixed-order sum of a split-K product's partial results (products.py), with no atomics."""

import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def sum_in_order(partials, out, TOTAL, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = ((p0[i] + p1[i]) + p2[i]) + ...: each element's partials in one fixed order."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < TOTAL
    acc = tl.load(partials + offsets, mask=mask, other=0.0)
    for part in tl.static_range(1, PARTS):
        acc = acc + tl.load(partials + part * TOTAL + offsets, mask=mask, other=0.0)
    tl.store(out + offsets, acc, mask=mask)


def sum_partials(partials, out) -> None:
    """out (contiguous float32) = the sum over the first axis of `partials` (contiguous,
    (parts,) + out's elements), left to right."""
    total = out.numel()
    sum_in_order[(triton.cdiv(total, BLOCK),)](partials, out, total, partials.shape[0], BLOCK, enable_fp_fusion=False)
