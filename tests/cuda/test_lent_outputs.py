"""Lent outputs (runtime.py's Captured): a captured graph may hand out its own output
buffers to a caller that takes them lent, as the run loop does, and a lent run keeps the
bits of a run that copies every output. An output that shares memory with any input's
buffer is never lent: the next call's copies in would write over what they read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sexpgpu.backends.cuda.runtime import _lendable  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class _Buffer:
    kind = "arena"


class _Lowered:
    def __init__(self, inputs: dict, outputs: dict):
        self.inputs, self.outputs = inputs, outputs
        self.buffers = {key: _Buffer() for key in (*inputs.values(), *outputs.values())}


def test_outputs_sharing_memory_with_an_input_buffer_are_not_lendable():
    arena = torch.zeros(64)
    env = {"in/a": arena[0:16], "in/b": torch.zeros(8), "out/inside-a": arena[8:12], "out/after-a": arena[16:32],
           "out/own": torch.zeros(8), "out/touching": arena[12:20]}
    lowered = _Lowered({"a": "in/a", "b": "in/b"},
                       {"x": "out/inside-a", "y": "out/after-a", "z": "out/own", "w": "out/touching", "echo": "in/b"})
    assert _lendable(lowered, env) == frozenset({"y", "z"})


class _Copying:
    """The CUDA backend as a caller that never takes outputs lent."""

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def run(self, graph, inputs, lent=False):
        return self.backend.run(graph, inputs)


def _trained(wrap, steps: int = 6) -> tuple[list, dict]:
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.loop import Trainer
    from sexpgpu.run.setup import build_run

    built = build_run(load_experiment(str(ROOT / "examples" / "tiny-adam.sexp")), "cpu")
    backend = wrap(CudaBackend())
    built.backend = built.feeder.backend = backend
    state = built.initial_state()
    trainer = Trainer(built.experiment.run, built.program, backend, built.feeder)
    digests = [trainer.step(state)["digest"] for _ in range(steps)]
    final = {name: backend.to_host(value) for name, value in {**state.params, **state.optimizer}.items()}
    return digests, final


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_a_run_that_takes_outputs_lent_has_the_bits_of_one_that_copies_them():
    lent_digests, lent_final = _trained(lambda backend: backend)
    copied_digests, copied_final = _trained(_Copying)
    assert lent_digests == copied_digests
    for name, value in copied_final.items():
        assert np.array_equal(lent_final[name].view(np.uint32), value.view(np.uint32)), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_the_update_hands_out_its_parameters_and_state_once_captured():
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    built = build_run(load_experiment(str(ROOT / "examples" / "tiny-adam.sexp")), "cuda")
    assert isinstance(built.backend, CudaBackend)
    update = built.program.training.update
    runner = built.backend._entry(update)[2]
    inputs = {name: built.backend.from_host(np.zeros(node.shape, np.float32)) if node.dtype == "f32"
              else np.int32(1) for name, node in update.inputs.items()}
    for _ in range(2):
        built.backend.run(update, inputs)
    lent = built.backend.run(update, inputs, lent=True)
    given = [name for name in lent if name.startswith(("param/", "state/"))]
    assert given and all(name in runner.lendable for name in given)
    again = built.backend.run(update, inputs, lent=True)
    assert all(lent[name].data_ptr() == again[name].data_ptr() for name in given)
    copied = built.backend.run(update, inputs)
    assert all(copied[name].data_ptr() != again[name].data_ptr() for name in given)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_inputs_of_mixed_dtypes_are_copied_in_with_a_few_launches():
    # an update's inputs: float32 parameters and an int32 step; PyTorch copies a list that
    # mixes dtypes tensor by tensor, one launch each
    from torch.profiler import ProfilerActivity, profile

    from sexpgpu.backends.cuda.runtime import _copy_all

    targets = [torch.empty(1000 + index, device="cuda") for index in range(50)]
    sources = [torch.randn(1000 + index, device="cuda") for index in range(50)]
    targets.append(torch.empty((), dtype=torch.int32, device="cuda"))
    sources.append(torch.tensor(3, dtype=torch.int32, device="cuda"))
    _copy_all(targets, sources)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as recorded:
        _copy_all(targets, sources)
        torch.cuda.synchronize()
    launches = [event for event in recorded.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    assert 1 <= len(launches) <= 4, [event.name for event in launches]
    assert all(torch.equal(target, source) for target, source in zip(targets, sources))
