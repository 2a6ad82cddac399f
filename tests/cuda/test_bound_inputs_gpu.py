"""Bound inputs on a GPU (runtime.py's Binding): real CUDA graphs read the parameters the
update lends where they lie, with the bits of runs that copy every input; the command line
repeats its metrics. Skipped where no GPU is present.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_bound_inputs_gpu.py -m gpu
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from bound_cases import assert_same_bits, copying_pair_steps, pair_steps, reader_graph, trained  # noqa: E402
from gpu_driver import run_on_the_gpu  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.runtime import Captured  # noqa: E402
from update_cases import adamw_update  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {"a/b": (300,), "a/w": (64, 300), "head": (3, 64)}


def _captured(backend, graph) -> Captured:
    runner = backend._entry(graph)[2]
    assert isinstance(runner, Captured) and runner.graph is not None
    return runner


def test_a_captured_reader_binds_the_lent_parameters_with_the_copied_bits():
    update, inputs = adamw_update(SHAPES, seed=5)
    reader = reader_graph(SHAPES)
    backend = CudaBackend()
    got = pair_steps(backend, update, reader, inputs, 6)
    for ours, theirs in zip(got, copying_pair_steps(update, reader, inputs, 6)):
        assert_same_bits(ours, theirs)
    reading, updating = _captured(backend, reader), _captured(backend, update)
    assert reading.binding.names == set(reader.inputs) and not updating.binding.bound
    lent = {updating.env[updating.executable.lowered.outputs[name]].data_ptr() for name in reader.inputs}
    assert {tensor.data_ptr() for tensor in reading.binding.bound.values()} == lent


def test_another_tensor_for_a_bound_name_is_copied_into_a_graph_captured_anew():
    update, inputs = adamw_update(SHAPES, seed=5)
    reader = reader_graph(SHAPES)
    fresh = torch.full((64, 300), 0.25, device="cuda")

    def change(step, given):
        return {**given, "param/a/w": fresh} if step == 4 else given

    backend = CudaBackend()
    got = pair_steps(backend, update, reader, inputs, 7, change)
    for ours, theirs in zip(got, copying_pair_steps(update, reader, inputs, 7, change)):
        assert_same_bits(ours, theirs)
    reading = _captured(backend, reader)
    assert reading.binding.barred == {"param/a/w"} and reading.binding.names == set(reader.inputs) - {"param/a/w"}
    assert torch.equal(fresh, torch.full((64, 300), 0.25, device="cuda"))  # read, never written


def test_the_run_loop_reads_the_updated_parameters_where_they_lie_with_the_copied_bits(tmp_path):
    backend = CudaBackend()
    losses, final, training = trained(backend, tmp_path, steps=8)
    plain = CudaBackend()
    plain.capture = False
    want_losses, want_final, _ = trained(plain, tmp_path, steps=8)
    assert losses == want_losses
    assert_same_bits(final, want_final)
    micro = _captured(backend, training.micro)
    assert micro.binding.names == {name for name in training.micro.inputs if name.startswith("param/")}


def test_the_command_line_twice_with_bound_parameters_gives_the_same_metrics(tmp_path):
    # two microbatches a step: the first call reads the parameters bound, the last lends its gradients
    text = (ROOT / "examples" / "char-lm.sexp").read_text()
    path = tmp_path / "char-lm.sexp"
    path.write_text(text.replace(":steps 200", ":steps 40").replace(":batch 16", ":batch 16 :microbatches 2"))
    logs = [(run_on_the_gpu(path, tmp_path / f"run{attempt}") / "metrics.jsonl").read_text() for attempt in range(2)]
    assert logs[0] == logs[1] and len(logs[0].splitlines()) >= 40
