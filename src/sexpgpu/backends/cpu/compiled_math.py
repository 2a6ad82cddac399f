"""sexpgpu.numerics' portable float32 functions compiled by numba: the same statements, one
element at a time.

numerics/retarget.py builds the GPU functions from the portable modules' code objects under
other globals, in which `K` is Triton's primitive set; this module does the same for numba,
with `K` the scalar primitives below, and compiles a loop over a float32 array's elements
around each function. Every operation is the portable one: IEEE float64 + - * / and sqrt
(numba without fast-math neither reassociates nor fuses a multiply-add; native.py says
more; a division by zero is IEEE's, as in numpy), and integer operations on bit patterns,
but for the conversions between float32 and float64, which are the processor's (CONVERSIONS
says why that gives the same bits). Integers differ in one way: numba computes
them in 64 bits where numpy keeps uint32, which gives the same values everywhere but in
the hard-case table's hash, whose product is taken modulo 2^32; `hard_case` below is that
function with the modulus written out. tests/backends/test_cpu_compiled_math.py checks the
bits against sexpgpu.numerics on every hard case, the special values and random bit patterns.

Each function's loop is compiled once per machine and cached (native.py). numba keys its
cache by the loop's own code only, not by the portable functions compiled into it, so the
key here also holds a hash of the portable package's sources: editing them compiles anew.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import numbers
import types
from pathlib import Path
from typing import NamedTuple

import numba
import numpy as np
from numba import types as nbtypes
from numba.extending import intrinsic

from sexpgpu.backends.cpu import native
from sexpgpu.backends.cpu.parallel import run_ranges
from sexpgpu.numerics.portable import erf, exp, ieee, log, roots, tables

PORTABLE_MODULES = (ieee, tables, exp, log, erf, roots)
FUNCTIONS = {"exp": "exp_f32", "log": "log_f32", "tanh": "tanh_f32", "sigmoid": "sigmoid_f32", "erf": "erf_f32",
             "rsqrt": "rsqrt_f32"}


def _bitcast(source, target):
    """A function that reinterprets a numba scalar of type `source` as one of `target`, bit for bit."""

    @intrinsic
    def bitcast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(source), codegen

    return bitcast


_bits_of = _bitcast(nbtypes.float64, nbtypes.int64)
_float_of = _bitcast(nbtypes.int64, nbtypes.float64)
_f32_bits = _bitcast(nbtypes.float32, nbtypes.uint32)
_f32_of = _bitcast(nbtypes.uint32, nbtypes.float32)


def _scalar(function):
    return numba.njit(inline="always", **native.OPTIONS)(function)


# --- K: the portable algorithms' primitives on numba scalars (numpy_ops.py on arrays) ---------------

def where(cond, a, b):
    return a if cond else b


def f64_bits(x):
    return _bits_of(np.float64(x))


def f64_from_bits(i):
    return _float_of(np.int64(i))


def to_f64(x):
    return np.float64(x)


def i64(x):
    return np.int64(x)


def u32(x):
    return np.uint32(x)


def i32(x):
    return np.int32(x)


def sqrt(x):
    return np.sqrt(x)


def gather_pair_if(table, index, mask):
    return table[index], table[index + 1]


def gather_f64(table, index):
    return _float_of(np.int64(table[index]) | (np.int64(table[index + 1]) << 32))


PRIMITIVES = {"where": where, "f64_bits": f64_bits, "f64_from_bits": f64_from_bits, "to_f64": to_f64,
              "trunc_i64": i64, "i64": i64, "u32": u32, "i32": i32, "sqrt": sqrt, "gather_pair_if": gather_pair_if,
              "gather_f64": gather_f64}


def hard_case(bits, result, near, tab, spec):
    """tables.hard_case with the slot's hash product taken modulo 2^32, as uint32 numpy does."""
    key = bits & spec[3]
    index = spec[0] + 2 * K.i32(((key * spec[1]) & 0xFFFFFFFF) >> spec[2])  # noqa: F821 (K is in the namespace)
    stored_key, answer = K.gather_pair_if(tab, index, near)  # noqa: F821
    return K.where(near & (stored_key == key), answer ^ (bits & spec[4]), result)  # noqa: F821


# --- conversions by the processor's own instructions --------------------------------------------------
# The portable conversions build a float64 from a float32's bits, and round a float64 to
# float32, in integer arithmetic, so that no device's flush-to-zero changes a subnormal. On
# the CPU the interpreter's numpy arithmetic already runs on the processor's IEEE operations
# with subnormals kept (no flush-to-zero, no denormals-are-zero), and under them its own
# conversions give the same values at a fraction of the cost: float32 -> float64 is exact,
# float64 -> float32 rounds to nearest even, overflowing to infinity and underflowing
# gradually. They differ only in a NaN's bits, which the functions never return (an invalid
# input's answer is the quiet NaN, chosen from its bits), and round_f32 keeps the portable
# quiet NaN. Sums hi + lo with lo != 0 round as the portable code does.


def f32_to_f64(bits):
    return np.float64(_f32_of(np.uint32(bits)))


def round_f32(hi, lo):
    if lo != 0.0:
        return portable_round_f32(hi, lo)  # noqa: F821 (in the namespace)
    return np.uint32(0x7FC00000) if hi != hi else _f32_bits(np.float32(hi))


CONVERSIONS = {"f32_to_f64": f32_to_f64, "round_f32": round_f32}


def _is_constant(value) -> bool:
    if isinstance(value, tuple):
        return all(_is_constant(item) for item in value)
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@functools.cache
def _namespace() -> dict:
    """The portable functions rebuilt over numba's K and compiled (inlined into their callers);
    built at the first call, not at import (a process that computes no function pays nothing)."""
    primitives = types.ModuleType("sexpgpu.backends.cpu.compiled_math.K")
    for name, function in PRIMITIVES.items():
        setattr(primitives, name, _scalar(function))
    primitives.static_range = range
    shared = {"K": primitives, "__name__": __name__}
    functions = {}
    for module in PORTABLE_MODULES:
        shared.update({name: value for name, value in vars(module).items()
                       if _is_constant(value) and not name.startswith("_")})
        functions.update({name: value for name, value in vars(module).items()
                          if inspect.isfunction(value) and value.__module__ == module.__name__
                          and not name.startswith("_")})
    functions["hard_case"] = hard_case
    functions["portable_round_f32"] = functions["round_f32"]
    functions.update(CONVERSIONS)
    shared.update(_f32_bits=_f32_bits, _f32_of=_f32_of, np=np)
    for name, function in functions.items():
        shared[name] = _scalar(types.FunctionType(function.__code__, shared, name, function.__defaults__))
    return shared


@functools.cache
def sources_hash() -> str:
    """A hash of every source of numerics/portable (the functions, and the constants and table
    offsets compiled into them) and of this module: part of the cache's key."""
    files = sorted(Path(ieee.__file__).parent.glob("*.py")) + [Path(__file__)]
    return hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()


def _loop_template(words, out, first, stop):  # pragma: no cover - compiled, with FUNCTION and TABLE bound
    for index in range(first, stop):
        out[index] = FUNCTION(words[index], TABLE)  # noqa: F821 (bound per function by _loop)


def _loop(name: str):
    """out[i] = the portable function `name`(words[i], tables.TABLE) for i in first .. stop-1, compiled.

    The table is a global of the loop, which numba compiles in as constant data: LLVM then
    knows that no store to `out` changes it, and vectorises the loop (its lookups become
    gathers); passed as an argument it might alias `out`, and the loop stayed scalar, at
    half the speed. Each element's operations are the same either way."""
    return _compiled(_loop_template, name, f"{name}_loop", FUNCTION=_namespace()[name])


def _compiled(template, key: str, label: str, **bindings):
    """`template` compiled with the portable functions, tables.TABLE and `bindings` as its globals.

    One code object serves several compiled functions, so numba's cache would key them
    alike: the key gets `key`, and the hash of the sources it compiles (the table's among them)."""
    bound = {**_namespace(), "TABLE": tables.TABLE, **bindings}
    run = types.FunctionType(template.__code__, bound, label)
    run.__qualname__ = label
    compiled = numba.njit(cache=True, **native.OPTIONS)(run)
    cache = getattr(compiled, "_cache", None)
    if cache is None or not hasattr(cache, "_index_key"):  # a numba whose cache this does not know: never stale
        return numba.njit(**native.OPTIONS)(run)
    numba_key = cache._index_key
    cache._index_key = lambda sig, codegen: numba_key(sig, codegen) + (sources_hash(), key)
    return compiled


_LOOPS: dict = {}


def apply(name: str, x: np.ndarray) -> np.ndarray:
    """sexpgpu.numerics' function `name` (a key of FUNCTIONS) of a float32 array, same shape, C order;
    a large array's elements are split across threads (each computed alone: no bit depends on it)."""
    loop = _LOOPS.get(name)
    if loop is None:
        loop = _LOOPS[name] = _loop(FUNCTIONS[name])
    words = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32)
    result = np.empty(np.shape(x), np.float32)  # owns its memory: the memo keeps it without a copy
    out = result.reshape(-1).view(np.uint32)
    run_ranges(lambda first, stop: loop(words, out, first, stop), words.size, words.size)
    return result


def _softmax_template(x, out, tops, totals, causal, first, stop):  # pragma: no cover - compiled, EXP bound
    """Rows first .. stop-1 of x's softmax, as op_kernels' softmax computes it: the IEEE
    maximum m of the row (into tops), e = exp(x - m) each, their left fold s (a NaN fold the
    quiet NaN; into totals), e / s. `causal`: row r's entries from r % W + 1 on are -inf,
    not read from x."""
    width = x.shape[1]
    for row in range(first, stop):
        valid = row % width + 1 if causal else width
        top = x[row, 0]
        for j in range(1, valid):
            v = x[row, j]
            # NaN wins, and +0 > -0 (the -inf of masked entries never changes the maximum)
            if top == top and (v != v or v > top or (v == top and _f32_bits(top) > _f32_bits(v))):
                top = v
        for j in range(valid):
            out[row, j] = _f32_of(EXP(_f32_bits(x[row, j] - top), TABLE))  # noqa: F821 (bound by _softmax_kernel)
        total = out[row, 0]
        for j in range(1, valid):
            total = total + out[row, j]
        if valid < width:
            masked = _f32_of(EXP(_f32_bits(np.float32(-np.inf) - top), TABLE))  # noqa: F821
            for j in range(valid, width):
                out[row, j] = masked
            if _f32_bits(masked) != 0 or _f32_bits(total) == 0x80000000:  # else adding +0 changes no bit
                for j in range(valid, width):
                    total = total + masked
        if total != total:
            total = np.float32(np.nan)
        for j in range(width):
            out[row, j] = out[row, j] / total
        tops[row], totals[row] = top, total


@functools.cache
def _softmax_kernel():
    return _compiled(_softmax_template, "softmax_rows", "softmax_rows", EXP=_namespace()["exp_f32"])


class Softmax(NamedTuple):
    """A softmax along the last axis, and the two values per row it was computed from."""

    probabilities: np.ndarray  # exp(x - maxima) / sums, x's shape
    maxima: np.ndarray  # x.shape[:-1]: each row's IEEE maximum
    sums: np.ndarray  # x.shape[:-1]: each row's left fold of exp(x - maxima)


def softmax_rows(x: np.ndarray, causal: bool) -> Softmax:
    """The softmax along the last axis of a float32 array with sexpgpu.numerics' exp, in the
    order and with the bits of op_kernels' softmax; `causal`: in each W x W block of the last
    two axes, row i's entries after column i are -inf (an attention's causal mask)."""
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    found = Softmax(np.empty(x.shape, np.float32), np.empty(x.shape[:-1], np.float32),  # each owns its memory:
                    np.empty(x.shape[:-1], np.float32))  # the memo keeps them without a copy
    out, tops, totals = found.probabilities.reshape(rows.shape), found.maxima.reshape(-1), found.sums.reshape(-1)
    kernel = _softmax_kernel()
    run_ranges(lambda first, stop: kernel(rows, out, tops, totals, causal, first, stop), rows.shape[0], rows.size)
    return found
