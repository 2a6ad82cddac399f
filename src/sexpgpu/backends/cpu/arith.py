"""The interpreter's two arithmetics.

`PortableF32` is the one runs use: float32 arrays, IEEE + - * / and sqrt from numpy, and
every other function from sexpgpu.numerics, whose results do not depend on the machine
(exp, log, tanh, sigmoid, erf and rsqrt its portable code compiled by numba:
compiled_math.py).
Nodes of dtype bf16 hold float32 arrays rounded to nearest even into bfloat16. Its results
are remembered by the exact bits of their inputs (`_Memo`, which shares them read-only, with
no copy), which changes no bit and saves repeated calls; a small pow of whole-number
exponents also computes the next exponents' results in the same call (Adam's bias
corrections, step after step).

`ReferenceF64` is a test oracle only: the same kernels in float64 with numpy's own
functions and no bf16 rounding, so that gradient rules can be checked against finite
differences without float32 noise. Its bits are not portable and no run uses it.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from sexpgpu import numerics as nx
from sexpgpu.backends.cpu.parallel import elementwise


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as a float32 array. NaN stays NaN (quiet)."""
    x = np.asarray(x, dtype=np.float32, order="C")  # not ascontiguousarray, which makes a 0-d x 1-d
    bits = x.view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    nan = np.isnan(x)
    if np.any(nan):
        rounded = np.where(nan, (bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000), rounded)
    return rounded.astype(np.uint32).view(np.float32).reshape(x.shape)


class _Memo:
    """Results of pure elementwise functions, looked up by the exact bits of their inputs.

    A hit gives a copy of the stored result: the bits the function gave for those bits the
    first time, which are the bits it gives every time. A graph often evaluates a function
    twice on one value (the softmax of a cross-entropy's gradient repeats its exp; a
    layernorm's gradient repeats its rsqrt), and small calls cost sexpgpu.numerics a fixed
    overhead far larger than their work. Inputs of up to SMALL elements are keyed by their
    bytes; of the larger ones the last LARGE are kept and compared in full."""

    SMALL = 1 << 12
    SMALL_ENTRIES = 256
    LARGE = 12  # a step of char-lm remembers 9 large results (exp, erf, softmax, attention's P and dS)
    LARGEST = 1 << 19  # elements: larger inputs or results are never kept (a memo holds 12 x 3 x 2 MB at most)

    def __init__(self):
        self.small: OrderedDict = OrderedDict()
        self.large: list = []

    def get(self, name: str, inputs: tuple):
        if inputs[0].size <= self.SMALL:
            key = self._key(name, inputs)
            found = self.small.get(key)
            if found is None:
                return None
            self.small.move_to_end(key)
            return found
        for entry_name, stored, result in self.large:
            if entry_name == name and all(_same_bits(a, b) for a, b in zip(stored, inputs)):
                return result
        return None

    def put(self, name: str, inputs: tuple, result: np.ndarray) -> None:
        size = inputs[0].size
        if size <= self.SMALL:
            self.small[self._key(name, inputs)] = _frozen(result)
            if len(self.small) > self.SMALL_ENTRIES:
                self.small.popitem(last=False)
        elif max(size, result.size) <= self.LARGEST:
            self.large = [(name, tuple(a.copy() for a in inputs), _frozen(result))] + self.large[: self.LARGE - 1]

    @staticmethod
    def _key(name: str, inputs: tuple) -> tuple:
        return (name, inputs[0].shape) + tuple(a.tobytes() for a in inputs)


def _frozen(result: np.ndarray) -> np.ndarray:
    """result made read-only, so that the memo and every caller can share it (no kernel writes
    its inputs; the interpreter copies a read-only output before handing it out): in place when
    it owns its memory, else a read-only copy, as a view's base may still be written."""
    if not result.flags.owndata:
        result = result.copy()
    result.flags.writeable = False
    return result


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    a, b = a.reshape(-1).view(np.uint32), b.reshape(-1).view(np.uint32)
    step = max(1, a.size // 64)  # a few elements first: most misses differ everywhere
    return np.array_equal(a[::step], b[::step]) and np.array_equal(a, b)


class PortableF32:
    name = "f32"
    float_dtype = np.float32
    rounds_bf16 = True
    POW_AHEAD = 64  # exponents looked ahead by a small pow of whole-number exponents

    def __init__(self):
        self.memo = _Memo()
        self.ahead = _Memo()  # pow results looked ahead, kept apart so that other calls never push them out

    @staticmethod
    def numpy_dtype(dtype: str):
        return {"f32": np.float32, "bf16": np.float32, "i32": np.int32, "bool": np.bool_}[dtype]

    def pow(self, x, y):
        x, y = np.broadcast_arrays(np.asarray(x, np.float32), np.asarray(y, np.float32))
        x, y = np.asarray(x, order="C"), np.asarray(y, order="C")
        for memo in (self.ahead, self.memo):
            found = memo.get("pow", (x, y))
            if found is not None:
                return found
        if x.size <= 16 and _whole_numbers(y):
            return self._pow_ahead(x, y)
        result = elementwise(nx.pow, x, y).astype(np.float32, copy=False)
        self.memo.put("pow", (x, y), result)
        return result

    def remembered(self, name: str, inputs: tuple, compute) -> np.ndarray:
        """compute(), a pure function of these input arrays named `name`, or what it gave before
        for inputs of the same bits (an attention's backward kernels recompute its forward's
        probabilities from the same q and k)."""
        found = self.memo.get(name, inputs)
        if found is None:
            found = compute()
            self.memo.put(name, inputs, found)
        return found

    def _pow_ahead(self, x, y):
        """x ** y and x ** (y + 1), ..., x ** (y + POW_AHEAD - 1) in one call, each kept in
        the memo: Adam's bias corrections raise constants to the step number, one step after
        another, and a call for two numbers costs as much as one for a hundred."""
        offsets = np.arange(self.POW_AHEAD, dtype=np.float32).reshape((-1,) + (1,) * y.ndim)
        xs = np.ascontiguousarray(np.broadcast_to(x, (self.POW_AHEAD,) + x.shape))
        ys = y + offsets  # exact: whole numbers below 2**24
        results = nx.pow(xs, ys).astype(np.float32, copy=False)
        for index in range(self.POW_AHEAD):
            self.ahead.put("pow", (xs[index], ys[index]), results[index])
        return results[0].copy()

    @staticmethod
    def softmax_rows(x: np.ndarray, causal: bool) -> tuple:
        """compiled_math.softmax_rows: the softmax along x's last axis (an attention's, masked or
        not) in one pass over each row, with its rows' maxima and sums (a `Softmax`)."""
        from sexpgpu.backends.cpu import compiled_math  # numba: imported at the first call (folds._native says why)

        return compiled_math.softmax_rows(x, causal)

    def _unary(self, name: str, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32, order="C")
        found = self.memo.get(name, (x,))
        if found is not None:
            return found
        from sexpgpu.backends.cpu import compiled_math  # numba: imported at the first function (folds._native says why)

        result = compiled_math.apply(name, x)
        self.memo.put(name, (x,), result)
        return result


def _whole_numbers(y: np.ndarray) -> bool:
    """Every y a whole number whose next POW_AHEAD successors are exact float32 values."""
    return bool(np.all((y == np.floor(y)) & (np.abs(y) < 2.0**23)))


def _portable(name: str):
    def function(self, x):
        return self._unary(name, x)

    function.__name__ = name
    return function


for _name in ("exp", "log", "tanh", "sigmoid", "erf", "rsqrt"):
    setattr(PortableF32, _name, _portable(_name))


_erf64 = np.vectorize(math.erf, otypes=[np.float64])


class ReferenceF64:
    name = "f64"
    float_dtype = np.float64
    rounds_bf16 = False
    softmax_rows = None  # no compiled softmax: the kernels run a softmax's numpy steps

    @staticmethod
    def numpy_dtype(dtype: str):
        return {"f32": np.float64, "bf16": np.float64, "i32": np.int32, "bool": np.bool_}[dtype]

    @staticmethod
    def remembered(name: str, inputs: tuple, compute) -> np.ndarray:
        return compute()

    def exp(self, x):
        return np.exp(x)

    def log(self, x):
        return np.log(x)

    def tanh(self, x):
        return np.tanh(x)

    def sigmoid(self, x):
        return 1.0 / (1.0 + np.exp(-x))

    def erf(self, x):
        return _erf64(x)

    def rsqrt(self, x):
        return 1.0 / np.sqrt(x)

    def pow(self, x, y):
        return np.power(x, y)
