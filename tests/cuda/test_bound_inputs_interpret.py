"""Bound inputs (runtime.py's Binding): a captured graph reads an input where another captured
graph of its backend lent it (the update's parameters, read by the next microbatch), with no
copy at capture nor at a call given that very tensor, and the bits of a run that copies every
input. Another tensor given for a bound name makes one capture anew, that name copied from
then on. Run on the CPU with Triton's interpreter, each capture and replay run eagerly over
the static environment (binding is a matter of which buffers the environment holds)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sexpgpu.backends.cuda import runtime  # noqa: E402
from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.placement import placements  # noqa: E402
from sexpgpu.backends.cuda.runtime import Captured, LentBuffers, _run_launches  # noqa: E402
from bound_cases import SHAPES, assert_same_bits, copying_pair_steps, pair_steps, reader_graph, trained  # noqa: E402
from update_cases import adamw_update  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py


class _Eagerly(Captured):
    """Captured, its capture and its replays run eagerly over the static environment (Triton's
    interpreter has no CUDA graphs): the warm-up's launches, then a graph that replays them."""

    def __init__(self, executable, lent_buffers):
        super().__init__(executable, lent_buffers)
        self.captures = 0

    def _recorded(self, env: dict):
        _run_launches(self.split.before, env)
        _run_launches(self.split.device, env)
        self.captures += 1
        return "recorded eagerly"

    def replay(self) -> None:
        _run_launches(self.split.device, self.env)


def _capturing(backend: CudaBackend) -> CudaBackend:
    """`backend`, each graph's runner an _Eagerly Captured sharing the backend's LentBuffers."""
    made = backend._entry

    def entry(graph):
        executable, runner = made(graph)[1:]
        if not isinstance(runner, Captured):
            backend._runners[id(graph)] = (graph, executable, _Eagerly(executable, backend.lent_buffers))
        return backend._runners[id(graph)]

    backend._entry = entry
    return backend


def _runner(backend, graph) -> _Eagerly:
    return backend._entry(graph)[2]


def _pair():
    update, inputs = adamw_update(SHAPES)
    return update, reader_graph(), inputs


def test_a_reader_binds_the_parameters_the_update_lends_and_keeps_the_copied_bits(monkeypatch):
    update, reader, inputs = _pair()
    backend = _capturing(CudaBackend(device="cpu"))
    copied = []
    monkeypatch.setattr(runtime, "_copy_all", lambda targets, sources: copied.append(list(sources)) or
                        [target.copy_(source) for target, source in zip(targets, sources)])
    got = pair_steps(backend, update, reader, inputs, 5)
    for ours, theirs in zip(got, copying_pair_steps(update, reader, inputs, 5, device="cpu")):
        assert_same_bits(ours, theirs)
    reading, updating = _runner(backend, reader), _runner(backend, update)
    params = set(reader.inputs)
    # captured at its second call from the update's eager outputs, at its third from its lent ones
    assert reading.captures == 2 and reading.binding.names == params and not reading.binding.open
    assert updating.captures == 1 and not updating.binding.bound  # its inputs are placed, or the host's
    lent = {id(tensor) for tensor in reading.binding.bound.values()}
    assert lent == {id(updating.env[updating.executable.lowered.outputs[name]]) for name in params}
    assert all(reading.env[reading.executable.lowered.inputs[name]] is tensor
               for name, tensor in reading.binding.bound.items())  # read where they lie
    later = copied[-6:]  # the last three steps' calls: a reader's, an update's
    assert not [source for sources in later for source in sources if id(source) in lent]


def test_another_tensor_for_a_bound_name_captures_once_more_and_copies_it_from_then_on():
    update, reader, inputs = _pair()
    fresh = torch.full((3, 5), 0.25)

    def change(step, given):
        return {**given, "param/a/w": fresh} if step == 3 else given

    backend = _capturing(CudaBackend(device="cpu"))
    got = pair_steps(backend, update, reader, inputs, 6, change)
    for ours, theirs in zip(got, copying_pair_steps(update, reader, inputs, 6, change, device="cpu")):
        assert_same_bits(ours, theirs)
    reading = _runner(backend, reader)
    assert reading.captures == 3 and reading.binding.barred == {"param/a/w"}
    assert reading.binding.names == set(reader.inputs) - {"param/a/w"}
    assert torch.equal(fresh, torch.full((3, 5), 0.25))  # read, never written


class _Lender:
    """A graph lending tensors, as far as LentBuffers can tell."""


def test_a_lent_tensor_the_slot_cannot_read_as_it_lies_is_copied():
    # called on the runner itself: the backend's checks hand it a contiguous copy of such a
    # tensor; its first, eager call (which reads its inputs as they lie) is given one too
    reader = reader_graph({"w": (3, 5), "b": (5,)})
    backend = _capturing(CudaBackend(device="cpu"))
    reading = _runner(backend, reader)
    crossed = torch.arange(15, dtype=torch.float32).reshape(5, 3).t()  # a transpose: not contiguous
    backend.lent_buffers.lend(_lender := _Lender(), [crossed])
    for given in (crossed.contiguous(), crossed, crossed):
        outputs = reading({"param/w": given, "param/b": torch.ones(5)}, lent=True)
        assert torch.equal(outputs["grad/w"], -crossed * crossed)
    assert reading.binding.barred == {"param/w"} and not reading.binding.bound and reading.captures == 1
    assert reading.env[reading.executable.lowered.inputs["param/w"]] is not crossed


def test_a_placed_input_is_never_bound():
    # the update's gradients come lent by the reader, but lie in the flat gradients' slots
    update, reader, inputs = _pair()
    backend = _capturing(CudaBackend(device="cpu"))
    pair_steps(backend, update, reader, inputs, 3)
    updating = _runner(backend, update)
    lowered = updating.executable.lowered
    placed = {name for name, key in lowered.inputs.items() if key in placements(lowered)}
    assert {name for name in update.inputs if name.startswith("grad/")} <= placed
    assert not updating.bindable & placed and not updating.binding.bound


def test_a_graph_never_binds_the_outputs_it_lends_itself():
    reader = reader_graph(own=True)
    _, inputs = adamw_update(SHAPES)
    start = {name: torch.from_numpy(inputs[name]) for name in reader.inputs}
    backend = _capturing(CudaBackend(device="cpu"))
    eager = CudaBackend(device="cpu")
    eager.capture = False
    given, want = dict(start), dict(start)
    for _ in range(4):
        given = backend.run(reader, given, lent=True)
        want = eager.run(reader, want)
        assert_same_bits(given, want)
    reading = _runner(backend, reader)
    # captured from the eager call's outputs: its own lent ones, which come next, never bind
    assert reading.binding.open == set(reader.inputs) and not reading.binding.bound and reading.captures == 1


def test_a_released_graph_lends_nothing_more():
    lent_buffers, lender = LentBuffers(), _Lender()
    tensor = torch.zeros(3)
    lent_buffers.lend(lender, [tensor])
    assert lent_buffers.lender(tensor) is lender and lent_buffers.lender(torch.zeros(3)) is None
    del lender
    assert lent_buffers.lender(tensor) is None


def test_the_run_loop_reads_the_updated_parameters_where_they_lie_with_the_copied_bits(tmp_path, monkeypatch):
    # the final parameters are compared bit for bit: the digest's kernels are slow interpreted
    monkeypatch.setattr("sexpgpu.run.loop.parameters_digest", lambda backend, params: "")
    backend = _capturing(CudaBackend(device="cpu"))
    losses, final, training = trained(backend, tmp_path)
    plain = CudaBackend(device="cpu")
    plain.capture = False
    want_losses, want_final, _ = trained(plain, tmp_path)
    assert losses == want_losses
    assert_same_bits(final, want_final)
    micro = _runner(backend, training.micro)
    assert micro.binding.names == {name for name in training.micro.inputs if name.startswith("param/")}
    assert micro.captures == 2  # at its second call, and again once the update lends the parameters


def test_an_exact_run_reads_bound_parameters_with_the_interpreters_bits(tmp_path, monkeypatch):
    # an exact microbatch graph's pending sums read its buffers after the replay: those inputs
    # are never bound (their lender may write over them first); the parameters are
    from sexpgpu.backends.cpu import Interpreter

    monkeypatch.setattr("sexpgpu.run.loop.parameters_digest", lambda backend, params: "")
    exact = ":batch 8 :microbatches 2 :arithmetic exact"
    backend = _capturing(CudaBackend(device="cpu"))
    losses, final, training = trained(backend, tmp_path, steps=3, batch=exact)
    want_losses, want_final, _ = trained(Interpreter(), tmp_path, steps=3, batch=exact)
    assert losses == want_losses
    assert_same_bits(final, want_final)
    micro = _runner(backend, training.micro)
    lowered = micro.executable.lowered
    held = {name for name, key in lowered.inputs.items() for launch in micro.split.after if key in launch.reads}
    assert micro.split.after and not micro.bindable & held
    assert micro.binding.names == {name for name in training.micro.inputs if name.startswith("param/")} - held
