"""Hypothesis strategies and random tensors for the exact library's tests.

Values come from random bit patterns, so every exponent is as likely as any other:
subnormals, the largest finite values and both zeros all appear, plus cancelling pairs.
"""

from __future__ import annotations

import struct

import torch
from hypothesis import strategies as st

EDGE_F32 = [0.0, -0.0, 1.0, -1.0, 2.0**-149, -(2.0**-149), 2.0**-126, 3.4028234663852886e38, -3.4028234663852886e38,
            1.1754942106924411e-38, 2.0**100, 2.0**-100]


def f32_from_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def bf16_from_bits(bits: int) -> float:
    return f32_from_bits(bits << 16)


def finite_values(dtype: torch.dtype):
    if dtype == torch.float32:
        from_bits = st.integers(0, 2**32 - 1).map(f32_from_bits)
    else:
        from_bits = st.integers(0, 2**16 - 1).map(bf16_from_bits)
    small_integers = st.integers(-8, 8).map(float)
    values = st.one_of(from_bits, from_bits, st.sampled_from(EDGE_F32), small_integers)
    return values.filter(lambda v: v == v and abs(v) != float("inf")).map(lambda v: _representable(v, dtype))


def _representable(value: float, dtype: torch.dtype) -> float:
    return torch.tensor(value, dtype=torch.float32).to(dtype).item()


@st.composite
def gemm_operands(draw, dtype: torch.dtype, max_m: int = 3, max_n: int = 3, max_k: int = 12):
    """(x, w) with x (M, K), w (N, K); sometimes the second half of K cancels the first."""
    m, n, k = draw(st.integers(1, max_m)), draw(st.integers(1, max_n)), draw(st.integers(0, max_k))
    values = finite_values(dtype)
    x = torch.tensor(draw(st.lists(values, min_size=m * k, max_size=m * k)), dtype=dtype).reshape(m, k)
    w = torch.tensor(draw(st.lists(values, min_size=n * k, max_size=n * k)), dtype=dtype).reshape(n, k)
    if draw(st.booleans()):
        x, w = torch.cat([x, x], dim=1), torch.cat([w, -w], dim=1)
    return x, w
