"""Compile the portable algorithms for Triton: the same code objects under other globals.

Every function in the portable modules (and in triton_wrappers.py) is rebuilt with
types.FunctionType(code, namespace) over one shared namespace, in which ``K`` is the
Triton primitive set of triton_ops.py, the modules' numeric constants are tl.constexpr,
and every function name is its jitted twin; then triton.jit compiles it. So the numpy path
and the CUDA path execute the same statements, operation for operation. Under
TRITON_INTERPRET=1 the same namespace runs in Triton's interpreter (constants stay plain
Python values there), which is how CI checks the GPU code without a GPU.

One exception: a function of triton_exact.py replaces the portable function of its name
(f32_to_f64, round_f32, clamp_f32), where a hardware instruction gives the same value as
the portable code; that module says why each keeps every bit.
"""

import functools
import inspect
import numbers
import types

from sexpgpu.numerics import triton_exact, triton_ops, triton_wrappers
from sexpgpu.numerics.portable import draws, erf, exp, ieee, log, philox, pow, roots, tables, trig

PORTABLE_MODULES = (ieee, philox, tables, exp, log, erf, trig, roots, pow, draws)


def _public_functions(module):
    return {name: obj for name, obj in vars(module).items()
            if inspect.isfunction(obj) and obj.__module__ == module.__name__
            and not name.startswith("_")}


def _is_constant(value):
    if isinstance(value, tuple):
        return all(_is_constant(v) for v in value)
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _rebind(fn, namespace, jit):
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__)
    # annotations live on the function, not its code: Triton reads tl.constexpr from them
    copy.__annotations__ = dict(fn.__annotations__)
    return jit(copy)


def _near_everywhere(y):
    # near_midpoint of the portable build: every lane takes the table's answer for its key,
    # as before the gate (an integer comparison, so NaN lanes too)
    return K.f64_bits(y) == K.f64_bits(y)  # noqa: F821 (K is in the shared namespace)


@functools.cache
def namespace(interpret, hardware=True):
    """The jitted portable functions and kernels by name, for compiled or interpreted mode.

    hardware=False builds the previous GPU build: the portable code without triton_exact's
    replacements, every lane reading the hard-case table and taking its answer for a key
    (no near_midpoint gate), kept as the oracle and the baseline of
    bench/verify_numerics_speed.py."""
    import triton
    import triton.language as tl

    ops_namespace = {"tl": tl, "triton": triton, "__name__": triton_ops.__name__}
    # a module object: Triton's dependency tracking skips modules but would copy a namespace
    ops = types.ModuleType("sexpgpu.numerics.compiled_ops")
    for name, fn in _public_functions(triton_ops).items():
        setattr(ops, name, _rebind(fn, ops_namespace, triton.jit))
    ops.static_range = range if interpret else tl.static_range
    if not hardware:
        ops.gather_pair_if = ops.gather_pair_every
    shared = {"K": ops, "tl": tl, "triton": triton, "__name__": "sexpgpu.numerics.compiled"}
    functions = {}
    for module in PORTABLE_MODULES + (triton_wrappers,) + ((triton_exact,) if hardware else ()):
        for name, value in vars(module).items():
            if _is_constant(value) and not name.startswith("_"):
                assert shared.get(name, value) == value, f"two constants named {name}"
                shared[name] = value if interpret else tl.constexpr(value)
        for name, fn in _public_functions(module).items():
            if module is triton_exact and name in functions:
                functions[name] = fn  # the hardware twin replaces the portable function
                continue
            assert name not in functions, f"two portable functions named {name}"
            functions[name] = fn
    if not hardware:
        functions["near_midpoint"] = _near_everywhere
    for name, fn in functions.items():
        shared[name] = _rebind(fn, shared, triton.jit)
    return shared
