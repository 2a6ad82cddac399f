"""The CPU interpreter: the executable reference for every backend.

`Interpreter().run(graph, inputs)` evaluates the graph's nodes in the graph's order with
one kernel per op (op_kernels.py: numpy, and loops compiled by numba without fast-math) and
returns its outputs. It decides nothing from the machine: sums fold in the orders folds.py
documents (products and trailing sums in compiled loops, native.py), transcendental
functions are sexpgpu.numerics' portable code (compiled: compiled_math.py), there is no
BLAS, threads split large kernels only where the split changes no bits (parallel.py), and
every node of dtype bf16 is rounded to bfloat16 when it is made. So the same graph and
inputs give the same bits on any machine with the same numpy semantics.

Speed: the first run of a graph compiles it into a list of steps, each a kernel with its
node's attributes already looked up (op_kernels.compile_kernel), its input positions, the
values that die after it, and whether it rounds to bf16. Input arrays that already have
the node's dtype and shape are taken as they are.

Inputs: every graph input must be given, and nothing else. Arrays must have the node's
shape; f32 and bf16 inputs must be float32 arrays (or Python floats for scalars, rounded to
nearest float32), bf16 inputs must already hold bfloat16 values, i32 inputs integers that
fit in int32, bool inputs booleans. Nothing is cast silently.

Exact arithmetic is in the graph (graph/passes/exact_region.py): a node of dtype acc or
marked exact takes its exact rule (exact_kernels.py, with sexpgpu.exact, which needs
PyTorch), each sum exact and rounded once; an acc value is an unrounded sum (an
`Accumulator`, or a `PendingSum` not formed yet: backends/exact_sums.py).

Outputs are fresh arrays the caller owns. Each intermediate value is dropped after its
last reader, by the graph's liveness (plan/memory.py's `lifetimes`, the one the plan measures). Beyond
that, each interpreter keeps a bounded memo of portable function results and attention
probabilities (arith.py).
"""

from __future__ import annotations

import importlib

import numpy as np

from sexpgpu.backends.contract import BackendDefaults, check_input_names, check_input_shape, host_input
from sexpgpu.backends.cpu.arith import PortableF32, ReferenceF64, round_bf16
from sexpgpu.backends.cpu.facts import cpu_facts
from sexpgpu.backends.cpu.fingerprint import fingerprint
from sexpgpu.backends.cpu.op_kernels import KERNELS, compile_kernel
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.core.ops import ACC, OPS
from sexpgpu.graph.passes.decomposed import decomposed
from sexpgpu.graph.passes.exact_region import is_exact
from sexpgpu.plan.memory import lifetimes


class Interpreter(BackendDefaults):
    name = "cpu"

    def __init__(self, precision: str = "f32"):
        """precision "f32" for runs; "f64" is a test oracle (see arith.py), never for runs."""
        arithmetics = {"f32": PortableF32, "f64": ReferenceF64}
        if precision not in arithmetics:
            raise ValueError(f"precision must be 'f32' or 'f64', not {precision!r}")
        self.math = arithmetics[precision]()
        self._prepared: dict = {}
        # dtypes an input array may have to be taken as it is (bf16 inputs are always checked)
        float_dtype = np.dtype(self.math.float_dtype)
        self._ready_dtypes = {"f32": float_dtype, "i32": np.dtype(np.int32), "bool": np.dtype(np.bool_)}

    def run(self, graph, inputs: dict, lent: bool = False) -> dict:
        """The outputs, as arrays of their own (`lent` changes nothing here)."""
        steps, positions, graph = self._prepare(graph)
        check_input_names(graph, inputs)
        values = [None] * len(graph.nodes)
        for name, node in graph.inputs.items():
            values[positions[node]] = self._accept(name, node, inputs[name])
        ndarray = np.ndarray
        with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are values here, not warnings
            for index, kernel, sources, dead, rounds, digits in steps:
                value = kernel([values[source] for source in sources])
                if type(value) is not ndarray and not digits:
                    value = np.asarray(value)
                if rounds:
                    value = round_bf16(value)
                values[index] = value
                if dead:
                    for source in dead:
                        values[source] = None
        return self._outputs(graph, values, positions)

    # --- arrays the run loop hands over -------------------------------------------------------

    def cast_parameter(self, array: np.ndarray, dtype: str) -> np.ndarray:
        """A float32 starting value stored as a parameter of `dtype` (bf16: rounded to nearest even)."""
        array = np.ascontiguousarray(array, dtype=np.float32)
        return round_bf16(array) if dtype == "bf16" else array

    @staticmethod
    def to_host(value) -> np.ndarray:
        return np.asarray(value)

    @staticmethod
    def fingerprints(values: list) -> list[int]:
        """Each parameter's 64-bit fingerprint (fingerprint.py), for the step's digest."""
        return [fingerprint(value) for value in values]

    @staticmethod
    def from_host(array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def facts(self) -> dict:
        return cpu_facts()

    def _prepare(self, graph):
        """(steps, positions, the graph they run): the graph with its composite ops that have
        no kernel written out."""
        cached = self._prepared.get(graph)
        if cached is not None:
            return cached
        given = graph
        while graph is not (graph := decomposed(graph, lambda node: OPS[node.op].decompose and node.op not in KERNELS)):
            pass  # again: a formula may use another composite op without a kernel
        positions = graph.positions()
        dying = _dying(graph)
        steps = []
        for index, node in enumerate(graph.nodes):
            if node.op == "input":
                continue
            sources = tuple(positions[source] for source in node.inputs)
            rounds = self.math.rounds_bf16 and node.dtype == "bf16"
            steps.append((index, self._kernel(node), sources, tuple(dying.get(index, ())), rounds,
                          node.dtype == ACC))
        self._prepared[given] = (steps, positions, graph)
        return steps, positions, graph

    def _kernel(self, node):
        if not is_exact(node):
            return compile_kernel(node, self.math)
        if self.math.float_dtype != np.float32:
            raise ValueError("exact arithmetic computes in float32, not with the f64 oracle")
        return _exact_kernels().exact_kernel(node, self.math)

    def _accept(self, name: str, node, value) -> np.ndarray:
        if node.dtype == ACC:  # an acc value one of this interpreter's graphs gave (backends/exact_sums.py)
            return value
        if (type(value) is np.ndarray and value.dtype == self._ready_dtypes.get(node.dtype)
                and value.shape == node.shape):
            return value  # already what the graph expects: nothing to convert or check
        # a Python number becomes the arithmetic's own float; arrays must be float32 (or float64 for the f64 oracle)
        float_types = (np.float32,) if self.math.float_dtype == np.float32 else (np.float64, np.float32)
        array = host_input(name, node, value, float_types)
        if node.dtype in ("f32", "bf16"):
            array = array.astype(self.math.float_dtype, copy=False)
        check_input_shape(name, node, array.shape)
        if node.dtype == "bf16" and self.math.rounds_bf16:
            rounded = round_bf16(array)
            bits = np.ascontiguousarray(array).view(np.uint32).reshape(array.shape)  # 0-d stays 0-d
            if not np.array_equal(rounded.view(np.uint32), bits):
                raise ValueError(f"input {name} is bf16 but holds values that are not bfloat16")
        return array

    @staticmethod
    def _outputs(graph, values: list, positions: dict) -> dict:
        result, given = {}, set()
        for name, node in graph.outputs.items():
            value = values[positions[node]]
            if type(value) is not np.ndarray:  # an exact gradient's digits: made for this run, never shared
                result[name] = value
                continue
            if node.op == "input" or not value.flags.owndata or not value.flags.writeable or id(value) in given:
                value = value.copy()
            given.add(id(value))
            result[name] = value
        return result


def _dying(graph) -> dict:
    """step -> the positions of the values it reads last, which it frees (plan/memory.py's
    liveness: inputs and outputs live to the end, and are the caller's)."""
    kept = {id(node) for node in (*graph.inputs.values(), *graph.outputs.values())}
    dying: dict = {}
    for index, (node, (born, dies)) in enumerate(zip(graph.nodes, lifetimes(graph))):
        if dies > born and id(node) not in kept:
            dying.setdefault(dies, []).append(index)
    return dying


def _exact_kernels():
    """exact_kernels.py, which runs on torch; E-EXACT-001 without it."""
    try:
        return importlib.import_module("sexpgpu.backends.cpu.exact_kernels")  # torch is optional: for exact graphs
    except ImportError as missing:
        raise SexpgpuError("E-EXACT-001", f":arithmetic exact needs PyTorch, which cannot be imported here ({missing}).",
                           hint="Install it (pip install 'sexpgpu[torch]') or run with :arithmetic float.") from None
