"""The fused attention's checks, shared by the Triton-interpreter test and the GPU test: one
attention_core with its loss and gradients (tests/op_cases.py's case graph), run by the CUDA
backend twice and by the CPU interpreter, the reference.

The envelope (docs/cuda.md, "Attention"): float32 results within op_cases' float32
tolerance; bf16 results within 1.6e-2 relative or 1e-2 of the largest magnitude (a bf16
cotangent is a sum of dS terms whose bf16 rounding may fall on either side where the two
computations differ by a float32 ulp, so a small element of a large sum moves by more than
its own rounding). Two runs on one backend give the same bits."""

from __future__ import annotations

import math

import numpy as np

from op_cases import TOLERANCE, OpCase, case_graph
from sexpgpu.backends.cpu import Interpreter

ENVELOPE = {"f32": TOLERANCE["f32"], "bf16": (1.6e-2, 1e-2)}
CPU = Interpreter()


def attention_case(shapes, dtype: str, causal: bool) -> OpCase:
    scale = 1.0 / math.sqrt(shapes[0][-1])
    return OpCase("attention_core", [(dtype, shape, "normal") for shape in shapes], {"scale": scale, "causal": causal})


def check(backend, shapes, dtype: str, causal: bool) -> None:
    graph, values = case_graph(attention_case(shapes, dtype, causal), seed=len(shapes[0]) + shapes[0][-2])
    want = CPU.run(graph, values)
    first, second = backend.run(graph, values), backend.run(graph, values)
    rtol, atol = ENVELOPE[dtype]
    for name, expected in want.items():
        got, again = backend.to_host(first[name]), backend.to_host(second[name])
        assert got.tobytes() == again.tobytes(), f"{name}: two runs differ"
        scale = max(1.0, float(np.max(np.abs(expected))))
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol * scale, err_msg=f"{name} {shapes} {dtype}")
