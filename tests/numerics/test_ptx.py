"""The compiled kernels use IEEE float64 arithmetic only: compiled here for sm_90 (no GPU
needed), their PTX has no fused multiply-add, every float64 add, subtract and multiply
carries an explicit rounding mode (.rn, which ptxas never contracts), and division and
square root are div.rn.f64 and sqrt.rn.f64; the float conversions are cvt.f64.f32 and
cvt.rn.f32.f64, never with .ftz (which would flush subnormals)."""

import re

import pytest

triton = pytest.importorskip("triton")

from sexpgpu.numerics import cuda, retarget  # noqa: E402

UNARY = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "tab": "*i32"}
CASES = [
    ("unary_kernel", UNARY, "erf_f32"),
    ("unary_kernel", UNARY, "exp_f32"),
    ("unary_kernel", UNARY, "sin_f32"),
    ("binary_kernel", {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                       "tab": "*i32"}, "pow_f32"),
    ("normal_kernel", {"out_ptr": "*fp32", "n": "i32", "args": "*i64", "args_stride": "i32"}, None),
]


@pytest.mark.parametrize("kernel, signature, fn", CASES, ids=[c[2] or c[0] for c in CASES])
def test_ptx_has_no_fused_or_approximate_float_operations(kernel, signature, fn):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ns = retarget.namespace(False)
    constants = {"BLOCK": cuda.BLOCK, **({"FN": ns[fn]} if fn else {"COPIES": 1})}
    compiled = triton.compile(ASTSource(fn=ns[kernel], signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32),
                              options={"enable_fp_fusion": False, "num_warps": cuda.NUM_WARPS})
    ptx = compiled.asm["ptx"]
    float_ops = re.findall(r"^\s*((?:add|sub|mul|fma|mad|div|sqrt|rcp|rsqrt|ex2|lg2|sin|cos)"
                           r"(?:\.\w+)*\.f(?:32|64))\b", ptx, re.M)
    assert float_ops, "no float64 arithmetic found"
    allowed = {"add.rn.f64", "sub.rn.f64", "mul.rn.f64", "div.rn.f64", "sqrt.rn.f64"}
    assert set(float_ops) <= allowed, sorted(set(float_ops) - allowed)
    # triton_exact.py's conversions keep subnormals only without .ftz
    conversions = set(re.findall(r"^\s*(cvt(?:\.\w+)*\.f(?:32|64)\.f(?:32|64))\b", ptx, re.M))
    if fn is not None:
        assert conversions == {"cvt.f64.f32", "cvt.rn.f32.f64"}, conversions
    assert ".ftz" not in ptx


DRAW_ARGS = {"n": "i32", "args": "*i64", "args_stride": "i32"}
SALT_SLOTS = {f"{name}{j}": kind for j in range(4) for name, kind in (("s", "*i32"), ("t", "i32"))}


@pytest.mark.parametrize("kernel, signature, constants", [
    ("uniform_kernel", {"out_ptr": "*fp32", **DRAW_ARGS}, {"COPIES": 3}),
    ("truncated_normal_kernel", {"out_ptr": "*fp32", **DRAW_ARGS}, {"COPIES": 2}),
    ("bernoulli_kernel", {"out_ptr": "*u8", **DRAW_ARGS}, {"COPIES": 1}),
    ("randint_kernel", {"out_ptr": "*i32", **DRAW_ARGS}, {"COPIES": 1}),
    ("fold_keys_kernel", {"source": "*i64", "source_stride": "i32", "out": "*i64", "rows": "i32", **SALT_SLOTS},
     {"SALTS": 4, "WORDS": 6, "BLOCK": 128}),
], ids=lambda value: value if isinstance(value, str) else None)
def test_the_captured_draws_kernels_compile_for_sm_90(kernel, signature, constants):
    """Their repeated stores and the key kernel's salt slots, as the GPU compiles them (the
    interpreter runs them as Python): the draw kernels with copies, every salt slot used."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constants = {"BLOCK": cuda.BLOCK, **constants}
    compiled = triton.compile(ASTSource(fn=retarget.namespace(False)[kernel], signature=signature,
                                        constexprs=constants),
                              target=GPUTarget("cuda", 90, 32),
                              options={"enable_fp_fusion": False, "num_warps": cuda.NUM_WARPS})
    assert ".ftz" not in compiled.asm["ptx"]
