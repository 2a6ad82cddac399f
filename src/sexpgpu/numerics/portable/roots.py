"""rsqrt: 1 / sqrt(x) with IEEE float64 square root and division (error below 2 ulps)."""

from sexpgpu.numerics.portable import numpy_ops as K
from sexpgpu.numerics.portable.exp import finish
from sexpgpu.numerics.portable.ieee import f32_to_f64
from sexpgpu.numerics.portable.tables import RSQRT_CASES

POS_INF = 0x7F800000


def rsqrt_f32(bits, tab):
    x = f32_to_f64(bits)
    y = 1.0 / K.sqrt(K.where((x > 0.0) & (x - x == 0.0), x, 1.0))
    out = finish(bits, (x < 0.0) | (x != x), K.where(x > 1.0e39, 0.0, y), 0.0, tab, RSQRT_CASES)
    return K.where(x == 0.0, (bits & 0x80000000) | POS_INF, out)
