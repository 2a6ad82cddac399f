"""Average pooling in bf16 rounds once, where the interpreter rounds: each output is the
float32 sum of its windows' shares, then one rounding to bf16. Found by the differential test
(seed 330): two overlapping windows' shares 2.125/3 and -2.375/3, each rounded to bf16 before
the sum, gave -0.0859375 against the interpreter's -0.08349609375."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py




def _same_bits(graph, inputs):
    want = Interpreter().run(graph, inputs)["y"]
    backend = CudaBackend(device="cpu")
    got = backend.to_host(backend.run(graph, inputs)["y"])
    assert np.array_equal(np.asarray(got, np.float32).view(np.uint32), np.asarray(want, np.float32).view(np.uint32))


def test_the_gradient_of_overlapping_windows_rounds_once():
    emit = Emitter()
    g = emit.input("g", "bf16", (1, 1, 2, 1))
    y = emit("avg_pool2d_grad", g, kernel=(3, 1), stride=(2, 1), input_shape=(1, 1, 5, 1))
    _same_bits(emit.graph({"g": g}, {"y": y}), {"g": np.array([2.125, -2.375], np.float32).reshape(1, 1, 2, 1)})


def test_the_average_of_a_bf16_window_rounds_once():
    emit = Emitter()
    x = emit.input("x", "bf16", (1, 1, 3, 1))
    y = emit("avg_pool2d", x, kernel=(3, 1), stride=(1, 1))
    values = torch.tensor([1.0078125, 3.0, -0.0029296875]).to(torch.bfloat16).float().numpy().reshape(1, 1, 3, 1)
    _same_bits(emit.graph({"x": x}, {"y": y}), {"x": values})
