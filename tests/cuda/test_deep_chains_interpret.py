"""A chain of thousands of elementwise ops lowers for CUDA (issue 10): the lowering writes out
any fused expression deeper than MAX_FUSED_DEPTH, because comparing, hashing and rewriting an
expression recurse through its levels. The split keeps every node's rounding, so the bits are
the CPU interpreter's. Before the fix a chain of 1,200 ops hit Python's recursion limit."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.fusion import FusionPolicy  # noqa: E402
from sexpgpu.backends.cuda.fusion import MAX_FUSED_DEPTH  # noqa: E402
from sexpgpu.backends.cuda.lowering import Lowerer  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402


@pytest.fixture(autouse=True)
def interpreted(monkeypatch):
    """Triton's interpreter without a GPU, set before any kernel of these tests is made."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def chain(depth: int, ops=("neg", "tanh", "relu")):
    e = Emitter()
    x = e.input("x", "f32", (4, 6))
    value = x
    for index in range(depth):
        value = e(ops[index % len(ops)], value)
    return e.graph({"x": x}, {"y": value})


def test_a_chain_past_the_recursion_limit_lowers_into_bounded_kernels():
    lowerer = Lowerer(chain(1200), FusionPolicy())
    assert len(lowerer.schedule().launches) >= 1200 // MAX_FUSED_DEPTH
    assert max(value.depth for value in lowerer.values.values()) <= MAX_FUSED_DEPTH


def test_a_split_chain_gives_the_interpreters_bits():
    graph = chain(3 * MAX_FUSED_DEPTH + 5)
    backend = CudaBackend() if torch.cuda.is_available() else CudaBackend(device="cpu")
    values = {"x": np.random.default_rng(7).standard_normal((4, 6)).astype(np.float32)}
    want = Interpreter().run(graph, values)["y"]
    got = backend.to_host(backend.run(graph, values)["y"])
    np.testing.assert_array_equal(got, want)
