"""Lent outputs (runtime.py's Captured): a captured graph may hand out its own output
buffers to a caller that takes them lent, as the run loop does, and a lent run keeps the
bits of a run that copies every output. An output that shares memory with any input's
buffer is never lent, but for an update made in place: an output lying exactly in the slot of
the input of its own name. Given back as that input it is not copied; any other tensor lying in
such a slot is cloned before the copies in, which would write over what they read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sexpgpu.backends.cuda.runtime import InPlace, _lendable  # noqa: E402
from update_cases import adamw_update, swapped  # noqa: E402

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


def _updated_in_place():
    arena = torch.zeros(64)
    env = {"in/a": arena[0:16], "in/b": arena[16:24], "out/a": arena[0:16].view(16), "out/b": arena[16:20],
           "out/c": arena[0:16].view(16)}
    return _Lowered({"a": "in/a", "b": "in/b"}, {"a": "out/a", "b": "out/b", "c": "out/c"}), env


def test_an_output_lying_exactly_in_the_slot_of_its_own_name_is_lendable():
    lowered, env = _updated_in_place()
    assert env["out/a"] is not env["in/a"]
    # b meets its own slot but is not that memory; c lies in a's slot, not one of its name
    assert _lendable(lowered, env) == frozenset({"a"})
    assert InPlace.of(lowered, env).names == frozenset({"a"})


def test_only_an_output_given_back_as_its_own_input_is_left_in_place_and_others_in_the_slots_are_cloned():
    lowered, env = _updated_in_place()
    updated = InPlace.of(lowered, env)
    fresh = torch.ones(8)
    inputs = {"a": env["out/a"], "b": env["out/a"][8:16]}
    assert updated.settled(inputs, env, lowered.outputs) == frozenset({"a"})
    detached = updated.detached(inputs, frozenset({"a"}))
    assert detached["a"] is env["out/a"] and detached["b"] is not inputs["b"] and torch.equal(detached["b"], inputs["b"])
    returned_copies = {"a": env["in/a"].clone(), "b": fresh}  # not the lent buffer itself: copied in
    assert updated.settled(returned_copies, env, lowered.outputs) == frozenset()
    assert all(value is returned_copies[name] for name, value in updated.detached(returned_copies, frozenset()).items())
    assert updated.detached({"a": env["out/a"]}, frozenset())["a"] is not env["out/a"]


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


def _given_back(backend, graph, inputs: dict, count: int, change, lent: bool) -> list:
    """`count` calls, each given the last one's outputs back under their names, then `change`d."""
    given, seen = dict(inputs), []
    for _ in range(count):
        outputs = backend.run(graph, given, lent=lent)
        seen.append({name: backend.to_host(value) for name, value in outputs.items()})
        given = change({**given, **{name: outputs[name] for name in given if name in outputs}})
    return seen


SAME_SHAPES = {"a/b": (300,), "c/b": (300,), "a/w": (64, 300), "head": (3, 64)}


def _fresh_parameter(given):
    return {**given, "param/a/w": torch.full((64, 300), 0.25, device="cuda")}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("change", [lambda given: given, swapped([("param/a/b", "state/m/c/b"), ("param/c/b", "state/m/a/b")]),
                                    _fresh_parameter], ids=["as-they-came", "under-each-others-names", "a-fresh-tensor"])
def test_a_captured_update_made_in_place_and_given_back_lent_has_the_eager_bits(change, monkeypatch):
    # Captured from the second call: its lent parameters and moments lie in the slots of the
    # inputs of their names (placement.in_place) and come back uncopied; swapped, they are
    # cloned before the copies in; a fresh tensor is copied in. The eager reference lowers each
    # result into memory of its own, as before updates were made in place.
    from sexpgpu.backends.cuda import lowering
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.cuda.runtime import Captured

    graph, inputs = adamw_update(SAME_SHAPES, seed=5)
    captured = CudaBackend()
    got = _given_back(captured, graph, inputs, 6, change, lent=True)
    runner = captured._entry(graph)[2]
    assert isinstance(runner, Captured) and runner.graph is not None
    updated = {name for name in graph.inputs if name.startswith(("param/", "state/"))}
    assert runner.updated.names == updated and updated <= runner.lendable
    monkeypatch.setattr(lowering, "in_place", lambda schedule: {})
    eager = CudaBackend()
    eager.capture = False
    want = _given_back(eager, graph, inputs, 6, change, lent=False)
    assert eager._entry(graph)[1].lowered.in_place == {}
    for step, (ours, theirs) in enumerate(zip(got, want)):
        for name, value in theirs.items():
            assert np.array_equal(np.asarray(ours[name]).view(np.uint32), np.asarray(value).view(np.uint32)), (step, name)
