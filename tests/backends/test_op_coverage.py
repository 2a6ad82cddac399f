"""Every op of the op table (graph/core/ops.py) has a CPU kernel (or a decomposition), a CUDA lowering and a test case
(tests/op_cases.py: a gradient case when the op has a gradient rule, else a forward case).
Adding an op without one of them fails here, naming the op and what it lacks."""

from __future__ import annotations

from op_cases import CASES, FORWARD_CASES
from sexpgpu.backends.cpu.op_kernels import KERNELS
from sexpgpu.backends.cuda.lowering import lowered_ops
from sexpgpu.graph.core.ops import EXACT_ONLY, OPS, OpDef

GRADIENT_CASE_OPS = {case.op for case in CASES}
ANY_CASE_OPS = GRADIENT_CASE_OPS | {case.op for case in FORWARD_CASES}
GIVEN = {"input"}  # a value the caller passes in: neither backend computes it
# ops of exact graphs alone, with exact rules only (tests/backends/test_exact_mode_ops.py covers them)
GIVEN = GIVEN | set(EXACT_ONLY)


def gaps(ops: dict) -> dict:
    """op -> what it lacks, for every op of `ops` that lacks something."""
    found = {}
    for name, definition in ops.items():
        lacks = []
        if KERNELS.needs(definition) and name not in KERNELS:  # a composite op may run decomposed
            lacks.append("a CPU kernel (backends/cpu/op_kernels.py KERNELS)")
        if name not in lowered_ops() and name not in EXACT_ONLY:
            lacks.append("a CUDA lowering (backends/cuda/lowering.py lowered_ops)")
        if definition.vjp is not None and name not in GRADIENT_CASE_OPS:
            lacks.append("a gradient case (tests/op_cases.py CASES)")
        elif name not in ANY_CASE_OPS and name not in GIVEN:
            lacks.append("a test case (tests/op_cases.py FORWARD_CASES)")
        if lacks:
            found[name] = lacks
    return found


def test_every_op_has_a_cpu_kernel_a_cuda_lowering_and_a_case():
    assert gaps(OPS) == {}


def test_an_op_added_without_them_is_named():
    def infer(inputs, attrs):
        return "f32", (), attrs

    table = dict(OPS, frobnicate=OpDef("frobnicate", "unary", infer, vjp=lambda e, node, g: (g,), arity=1),
                 twiddle=OpDef("twiddle", "unary", infer, arity=1))
    found = gaps(table)
    assert sorted(found) == ["frobnicate", "twiddle"]
    assert [text.split(" (")[0] for text in found["frobnicate"]] == ["a CPU kernel", "a CUDA lowering", "a gradient case"]
    assert found["twiddle"][-1].startswith("a test case")
