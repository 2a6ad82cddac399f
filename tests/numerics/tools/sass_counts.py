"""Instruction counts of the compiled kernels, without a GPU: sm_90 SASS by opcode.

    PYTHONPATH=src python tests/numerics/tools/sass_counts.py exp_f32 erf_f32 pow_f32

Compiles unary_kernel (binary_kernel for pow_f32) with each function, as cuda.launch does,
and disassembles the cubin with the cuobjdump that ships with Triton. A static count over
the kernel's cuda.BLOCK / (32 NUM_WARPS) elements a thread, slow paths included; a proxy for
speed where no GPU is at hand (docs/numerics.md quotes it), not a measurement.
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sexpgpu.numerics import cuda, retarget

UNARY = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "tab": "*i32"}
BINARY = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "tab": "*i32"}


def sass(fn_name, hardware=True):
    ns = retarget.namespace(False, hardware)
    kernel, signature = ("binary_kernel", BINARY) if fn_name == "pow_f32" else ("unary_kernel", UNARY)
    compiled = triton.compile(
        ASTSource(fn=ns[kernel], signature=signature,
                  constexprs={"BLOCK": cuda.BLOCK, "FN": ns[fn_name]}),
        target=GPUTarget("cuda", 90, 32),
        options={"enable_fp_fusion": False, "num_warps": cuda.NUM_WARPS})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run([tool, "-sass", cubin.name], capture_output=True, text=True,
                              check=True).stdout


def opcodes(text):
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text)
    return collections.Counter(op for op in ops if op != "NOP")


def main(names):
    for name in names:
        for hardware in (False, True):
            counts = opcodes(sass(name, hardware))
            float64 = sum(counts[op] for op in ("DADD", "DMUL", "DFMA", "DSETP"))
            print(f"{name:12s} {'GPU build' if hardware else 'portable':9s} "
                  f"{sum(counts.values()):5d} instructions, {float64:4d} float64; "
                  + " ".join(f"{op} {n}" for op, n in counts.most_common(8)))


if __name__ == "__main__":
    main(sys.argv[1:] or ["exp_f32", "erf_f32", "tanh_f32", "sigmoid_f32", "log_f32"])
