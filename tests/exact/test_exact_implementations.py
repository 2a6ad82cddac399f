"""Every CPU implementation behind the kernel boundary gives the same digits, also at the edges."""

import pytest
import torch

from exact_random import EVERY_CPU_IMPLEMENTATION, wide_random
from sexpgpu.exact import det_gemm_partial
from sexpgpu.exact import implementations
from sexpgpu.exact.layout import DIGITS, WIDTH


def digits_by_implementation(x, w):
    results = {}
    for name in EVERY_CPU_IMPLEMENTATION:
        with implementations.forced(name):
            results[name] = det_gemm_partial(x, w).digits
    return results


def operand_cases():
    generator = torch.Generator().manual_seed(51)
    for dtype in (torch.float32, torch.bfloat16):
        yield f"{dtype}, every exponent", wide_random((4, 300), dtype, generator, 150), wide_random((3, 300), dtype, generator, 150)
    # Long K crosses the chunk sizes of both implementations (2048 and 16384 products).
    yield "long K", wide_random((2, 20000), torch.float32, generator, 8), wide_random((2, 20000), torch.float32, generator, 8)
    # 3000 products near 2**256 sum past the top digit's weight range.
    huge = torch.full((2, 3000), 3.0e38)
    yield "sums beyond 2**256", huge, torch.cat([huge[:1], -huge[:1]])
    tiny = torch.full((2, 50), 2.0**-149)
    yield "subnormal products", tiny, torch.cat([tiny[:1], -tiny[:1] * 3])


@pytest.mark.parametrize("name, x, w", list(operand_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_cpu_implementations_agree(name, x, w):
    results = digits_by_implementation(x, w)
    reference = results.pop("bins")
    assert reference.shape == (WIDTH, x.shape[0], w.shape[0])
    for other in results.values():
        assert torch.equal(other, reference)
    assert (reference[:DIGITS - 1] >= 0).all() and (reference[:DIGITS - 1] < 2**32).all()
