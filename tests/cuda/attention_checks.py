"""The fused attention's checks, shared by the Triton-interpreter test and the GPU test: one
attention_core with its loss and gradients (tests/op_cases.py's case graph), run by the CUDA
backend twice and by the CPU interpreter, the reference.

The envelope (docs/cuda.md, "Attention"): float32 results within op_cases' float32
tolerance; bf16 results within 1.6e-2 relative or 1e-2 of the largest magnitude (a bf16
cotangent is a sum of dS terms whose bf16 rounding may fall on either side where the two
computations differ by a float32 ulp, so a small element of a large sum moves by more than
its own rounding). Two runs on one backend give the same bits.

Float32 results are also held to a float64 evaluation of the same formula: the fused
kernels' products are 3xTF32 (each operand split into two tf32 parts, the product of the
small parts dropped: about 2^-22 of each term where float32 rounds to 2^-24), so their error
is of the order of the interpreter's own float32 error. The bound: at most
F64_FACTOR times the interpreter's error, plus F64_FLOOR of the largest magnitude for an
output the interpreter happens to get almost exactly."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from op_cases import TOLERANCE, OpCase, case_graph
from sexpgpu.backends.cpu import Interpreter

ENVELOPE = {"f32": TOLERANCE["f32"], "bf16": (1.6e-2, 1e-2)}
F64_FACTOR = 4.0
F64_FLOOR = 2.0**-21
CPU = Interpreter()


def attention_case(shapes, dtype: str, causal: bool, scale: float | None = None) -> OpCase:
    """The case of the shapes, scaled by 1 / sqrt(width) unless a `scale` is given."""
    scale = 1.0 / math.sqrt(shapes[0][-1]) if scale is None else scale
    return OpCase("attention_core", [(dtype, shape, "normal") for shape in shapes], {"scale": scale, "causal": causal})


def check(backend, shapes, dtype: str, causal: bool, scale: float | None = None) -> None:
    case = attention_case(shapes, dtype, causal, scale)
    graph, values = case_graph(case, seed=len(shapes[0]) + shapes[0][-2])
    want = CPU.run(graph, values)
    first, second = backend.run(graph, values), backend.run(graph, values)
    rtol, atol = ENVELOPE[dtype]
    exact = float64_attention(values, case.attrs["scale"], causal) if dtype == "f32" else {}
    for name, expected in want.items():
        got, again = backend.to_host(first[name]), backend.to_host(second[name])
        assert got.tobytes() == again.tobytes(), f"{name}: two runs differ"
        scale = max(1.0, float(np.max(np.abs(expected))))
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol * scale, err_msg=f"{name} {shapes} {dtype}")
        if name in exact:
            check_against_float64(name, got, expected, exact[name])


class Float64Errors(NamedTuple):
    ours: float  # the largest error of the result checked against float64
    reference: float  # the interpreter's largest error
    top: float  # the largest magnitude of the float64 result

    @property
    def within(self) -> bool:
        """At most F64_FACTOR times the interpreter's error, plus the floor."""
        return self.ours <= F64_FACTOR * self.reference + F64_FLOOR * self.top


def float64_errors(got, interpreted, exact) -> Float64Errors:
    """The norm-wise errors against float64 of a result and of the interpreter's."""
    exact = np.asarray(exact, dtype=np.float64)
    if not exact.size:
        return Float64Errors(0.0, 0.0, 0.0)
    ours, reference = (float(np.max(np.abs(np.asarray(value, dtype=np.float64) - exact))) for value in (got, interpreted))
    return Float64Errors(ours, reference, float(np.max(np.abs(exact))))


def check_against_float64(name: str, got, interpreted, exact) -> None:
    """The fused error against float64 within F64_FACTOR of the interpreter's, plus the floor."""
    errors = float64_errors(got, interpreted, exact)
    assert errors.within, (f"{name}: error {errors.ours:.3g} against float64, the interpreter's "
                           f"{errors.reference:.3g}, largest magnitude {errors.top:.3g}")


def float64_attention(values: dict, scale: float, causal: bool) -> dict:
    """The case graph's attention output and the gradients of sum(y * w) in float64:
    P = softmax(q k^T * scale, masked), y = P v, dS = P (w v^T - rowsum(w v^T * P))."""
    q, k, v, w = (values[name].astype(np.float64) for name in ("x0", "x1", "x2", "w"))
    swap = lambda x: np.swapaxes(x, -1, -2)
    scores = q @ swap(k) * scale
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = w @ swap(v)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return {"y": p @ v, "grad0": ds @ k * scale, "grad1": swap(ds) @ q * scale, "grad2": swap(p) @ w}
