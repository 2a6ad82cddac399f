"""Captured graphs keep the optimizer's inputs inside the arena: the update's concatenation
of parameters then copies nothing, and the outputs are the same bits. Its flat kernel
writes the new parameters and moments over the old ones (placement.in_place), so those that
come back lent as the next call's inputs are in place already. Run on the CPU with Triton's
interpreter (the placement is a property of the lowering, not of the GPU)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda import lowering, runtime  # noqa: E402
from sexpgpu.backends.cuda.codegen.expr import Expr, load  # noqa: E402
from sexpgpu.backends.cuda.codegen.space import View, contiguous  # noqa: E402
from sexpgpu.backends.cuda.launches import Buffer, FlatLaunch, TorchLaunch  # noqa: E402
from sexpgpu.backends.cuda.placement import in_place, placements  # noqa: E402
from sexpgpu.backends.cuda.runtime import Captured, _run_launches  # noqa: E402
from sexpgpu.lang.experiment import OptimizerSpec  # noqa: E402
from update_cases import adamw_update, swapped  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py

ROOT = Path(__file__).resolve().parents[2]

SHAPES = {"a/b": (5,), "a/w": (3, 5), "head": (2, 3)}


def _update(shapes=SHAPES):
    return adamw_update(shapes)


def test_every_flattened_input_lies_in_its_concatenation():
    graph, _ = _update()
    lowered = CudaBackend(device="cpu").lowered(graph)
    placed = placements(lowered)
    flattened = {key for name, key in lowered.inputs.items() if name not in ("step", "lr")}
    assert flattened <= set(placed)
    sliced = {key for name, key in lowered.outputs.items() if name != "grad_norm"}
    assert sliced <= set(placed)  # each new parameter and moment: its slice of the flat result
    concatenations = {step.writes[0] for step in lowered.launches if step.kind == "concat"}
    assert {placed[key][0] for key in flattened} <= concatenations


def test_placed_inputs_give_the_same_bits_and_the_concatenation_copies_nothing():
    graph, inputs = _update()
    backend = CudaBackend(device="cpu")
    accepted = {name: backend._accept(name, graph.inputs[name], value) for name, value in inputs.items()}
    executable = backend._entry(graph)[1]
    plain = executable(accepted)
    env = executable.static_environment(accepted)
    arena = executable.arena
    start, stop = arena.data_ptr(), arena.data_ptr() + arena.numel()
    for key, (target, _) in placements(executable.lowered).items():
        if executable.lowered.buffers[key].kind == "input":
            assert start <= env[key].data_ptr() < stop, key
    copied = {}
    original = torch.Tensor.copy_

    def counting_copy(target, source, *args, **kwargs):
        copied[target.data_ptr()] = True
        return original(target, source, *args, **kwargs)

    torch.Tensor.copy_ = counting_copy
    placed_concatenations = 0
    try:
        for step in executable.lowered.launches:
            if step.kind == "concat" and {alias[0] for alias in step.aliases} == set(step.reads):
                before = {key: env[key].clone() for key in step.writes}
                step(env)
                assert not copied, "a concatenation of placed inputs copied"
                assert all(torch.equal(before[key], env[key]) for key in step.writes)
                placed_concatenations += 1
            else:
                step(env)
    finally:
        torch.Tensor.copy_ = original
    assert placed_concatenations == 4  # parameters, gradients, and Adam's two moments
    for name, key in executable.lowered.outputs.items():
        assert torch.equal(env[key], plain[name]), name


def test_an_output_that_widens_a_bf16_value_keeps_its_own_dtype():
    # A bf16 product read out as float32 through a view: the cast is a load in a kernel, so the
    # output is a copy of the product's arena buffer; placing the output there hands back bf16.
    from sexpgpu.graph.core.emit import Emitter

    emit = Emitter()
    a, b = emit.input("a", "f32", (4, 8)), emit.input("b", "f32", (8, 3))
    product = emit("matmul", emit("cast", a, dtype="bf16"), emit("cast", b, dtype="bf16"))
    widened = emit("transpose", emit("cast", product, dtype="f32"), perm=(1, 0))  # as a weight's gradient
    graph = emit.graph({"a": a, "b": b}, {"y": widened})
    lowered = CudaBackend(device="cpu").lowered(graph)
    for operand, (target, _) in placements(lowered).items():
        assert lowered.buffers[operand].dtype == lowered.buffers[target].dtype
    output = lowered.outputs["y"]
    assert lowered.buffers[output].dtype == "f32"


class _Replayed(Captured):
    """Captured, its replay run eagerly over the static environment (Triton's interpreter has
    no CUDA graphs): each call takes Captured's path of copies in, skips and clones."""

    def __init__(self, executable, inputs: dict):
        super().__init__(executable)
        self.calls, self.graph = 1, "replayed eagerly"
        self.adopt(executable.static_environment(inputs))

    def replay(self) -> None:
        _run_launches(self.split.device, self.env)


def _not_in_place(monkeypatch) -> CudaBackend:
    """A backend lowering as before updates were made in place: every result in memory of its own."""
    monkeypatch.setattr(lowering, "in_place", lambda schedule: {})
    return CudaBackend(device="cpu")


def _bits(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy().view(np.uint32)


def _updates(path: str):
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    return build_run(load_experiment(str(ROOT / path)), "cpu").program.training.update


@pytest.mark.parametrize("path", ["examples/tiny-adam.sexp", "examples/char-lm.sexp"])
def test_the_flat_update_writes_parameters_and_moments_over_the_old_ones(path, monkeypatch):
    # char-lm: AdamW with clipping, whose flat kernel reads the gradients' norm too
    update = _updates(path)
    lowered = CudaBackend(device="cpu").lowered(update)
    placed = placements(lowered)
    updated = [name for name in update.inputs if name.startswith(("param/", "state/"))]
    assert updated and len(lowered.in_place) == 3  # the flat parameters, m and v
    for name in updated:
        (source, view), (result, same_view) = placed[lowered.inputs[name]], placed[lowered.outputs[name]]
        assert lowered.in_place[result] == source and view == same_view, name
        assert lowered.offsets[result] == lowered.offsets[source], name
    gradients = {placed[key][0] for name, key in lowered.inputs.items() if name.startswith("grad/")}
    assert len(gradients) == 1 and not gradients & set(lowered.in_place.values())
    before = _not_in_place(monkeypatch).lowered(update)
    flat = sum(lowered.buffers[key].nbytes for key in lowered.in_place)
    assert lowered.arena_bytes <= before.arena_bytes - flat


def _lent_steps(captured, inputs: dict, count: int, change=lambda given: given) -> list:
    """`count` calls, each but the first given the last call's lent outputs back (through `change`)."""
    given, seen = dict(inputs), []
    for _ in range(count):
        outputs = captured(given, lent=True)
        seen.append({name: value.clone() for name, value in outputs.items()})
        given = change({**given, **{name: outputs[name] for name in given if name in outputs}})
    return seen


def _eager_steps(executable, inputs: dict, count: int, change=lambda given: given) -> list:
    given, seen = dict(inputs), []
    for _ in range(count):
        outputs = executable({name: value.clone() for name, value in given.items()})
        seen.append(outputs)
        given = change({**given, **{name: outputs[name] for name in given if name in outputs}})
    return seen


def _assert_same_bits(got: list, want: list) -> None:
    for step, (ours, theirs) in enumerate(zip(got, want)):
        for name in theirs:
            assert np.array_equal(_bits(ours[name]), _bits(theirs[name])), (step, name)


def _accepted(backend, graph, inputs: dict) -> dict:
    return {name: backend._accept(name, graph.inputs[name], value) for name, value in inputs.items()}


def test_updates_made_in_place_and_given_back_lent_keep_the_bits_of_the_old_plan(monkeypatch):
    graph, inputs = _update()
    backend = CudaBackend(device="cpu")
    accepted = _accepted(backend, graph, inputs)
    captured = _Replayed(backend._entry(graph)[1], accepted)
    names = {name for name in graph.inputs if name.startswith(("param/", "state/"))}
    assert captured.updated.names == names and names <= captured.lendable and not captured.returned
    copied = []
    monkeypatch.setattr(runtime, "_copy_all", lambda targets, sources: copied.append(len(targets)) or
                        [target.copy_(source) for target, source in zip(targets, sources)])
    got = _lent_steps(captured, accepted, 4)
    assert copied == [len(graph.inputs)] + [len(graph.inputs) - len(names)] * 3  # the gradients, step and lr
    want = _eager_steps(_not_in_place(monkeypatch)._entry(graph)[1], accepted, 4)
    _assert_same_bits(got, want)


# (optimizer, the inputs it updates in place, how many flat buffers those lie in). Nesterov's
# momentum writes each new parameter with a kernel of its own, not sliced from a flat result:
# its parameters are copied out and in as before, its momentum is updated in place.
OPTIMIZERS = [(OptimizerSpec("sgd", lr=0.1), ("param/",), 1),
              (OptimizerSpec("momentum", lr=0.1, nesterov=True), ("state/",), 1),
              (OptimizerSpec("adam", lr=0.1), ("param/", "state/"), 3)]


@pytest.mark.parametrize("optimizer, updated, flat", OPTIMIZERS, ids=[case[0].kind for case in OPTIMIZERS])
def test_every_optimizer_updates_in_place_with_the_old_bits(optimizer, updated, flat, monkeypatch):
    graph, inputs = adamw_update(SHAPES, optimizer=optimizer)
    backend = CudaBackend(device="cpu")
    accepted = _accepted(backend, graph, inputs)
    captured = _Replayed(backend._entry(graph)[1], accepted)
    assert captured.updated.names == {name for name in graph.inputs if name.startswith(updated)}
    assert len(captured.executable.lowered.in_place) == flat
    got = _lent_steps(captured, accepted, 3)
    _assert_same_bits(got, _eager_steps(_not_in_place(monkeypatch)._entry(graph)[1], accepted, 3))


def test_outputs_given_back_under_each_others_names_are_copied_in_from_clones(monkeypatch):
    # parameters of one shape given back swapped: each slot's copy would read the other's
    # slot, which a copy before it may have written; the clones keep the values
    graph, inputs = _update({"a/b": (5,), "c/b": (5,), "head": (2, 3)})
    backend = CudaBackend(device="cpu")
    accepted = _accepted(backend, graph, inputs)
    change = swapped([("param/a/b", "param/c/b"), ("state/m/a/b", "state/m/c/b")])
    got = _lent_steps(_Replayed(backend._entry(graph)[1], accepted), accepted, 3, change)
    want = _eager_steps(_not_in_place(monkeypatch)._entry(graph)[1], accepted, 3, change)
    _assert_same_bits(got, want)


def test_a_fresh_tensor_given_for_an_updated_input_is_copied_in(monkeypatch):
    graph, inputs = _update()
    backend = CudaBackend(device="cpu")
    accepted = _accepted(backend, graph, inputs)
    fresh = torch.full((3, 5), 0.25)

    def change(given):
        return {**given, "param/a/w": fresh, "state/v/head": given["state/v/head"].clone()}

    got = _lent_steps(_Replayed(backend._entry(graph)[1], accepted), accepted, 3, change)
    want = _eager_steps(_not_in_place(monkeypatch)._entry(graph)[1], accepted, 3, change)
    _assert_same_bits(got, want)
    assert torch.equal(fresh, torch.full((3, 5), 0.25))  # read, never written


def test_no_output_of_an_update_shares_memory_with_the_buffers_its_inputs_lie_in_but_its_own():
    # gpt-50m's new parameters once took the memory of the flat gradients, which die before
    # them: then they overlapped an input's buffer, could not be lent, and were copied out and
    # in again at every step (runtime.py's _lendable). An output may share memory only with the
    # input buffer it updates in place, and exactly.
    update = _updates("bench/gpt-50m.sexp")
    lowered = CudaBackend(device="cpu").lowered(update)
    placed = placements(lowered)

    def span(key):
        return lowered.offsets[key], lowered.offsets[key] + lowered.buffers[key].nbytes

    holding_inputs = {placed[key][0] for key in lowered.inputs.values() if key in placed}
    holding_outputs = {placed[key][0] for key in lowered.outputs.values() if key in placed}
    assert len(holding_inputs) == 4 and len(holding_outputs) == 3  # flat parameters, gradients, moments
    for output in holding_outputs:
        for held in holding_inputs:
            (a, b), (c, d) = span(output), span(held)
            assert b <= c or d <= a or (lowered.in_place[output] == held and (a, b) == (c, d)), (output, held)


REVERSED = View((4,), (-1,), 3)  # element i of four at 3 - i


def _one_update(read_view=contiguous((4,)), later_reader=False, output_name="p"):
    """A schedule of an update of one parameter `p`: its input placed in the flat buffer `old`,
    a flat kernel reading `old` (also through `read_view`) into `new`, its output placed in `new`."""
    shape, plain = (4,), contiguous((4,))
    buffers = {key: Buffer(key, "f32", shape, kind) for key, kind in
               [("in", "input"), ("old", "arena"), ("new", "arena"), ("out", "output"), ("after", "arena")]}
    value = Expr("add", (load("old", read_view), load("old", plain)))
    launches = [TorchLaunch(None, ("in",), ("old",), "concat", aliases=(("in", "old", plain),)),
                FlatLaunch(shape, [("new", plain, "f32", value)]),
                TorchLaunch(None, ("new",), ("out",), "copy", aliases=(("out", "new", plain),))]
    if later_reader:
        launches.append(FlatLaunch(shape, [("after", plain, "f32", load("old", plain))]))
    return SimpleNamespace(launches=launches, buffers=buffers, inputs={"p": "in"}, outputs={output_name: "out"})


@pytest.mark.parametrize("spoilt, takes", [
    ({}, {"new": "old"}),
    ({"later_reader": True}, {}),  # a launch after the update still reads the old values
    ({"read_view": REVERSED}, {}),  # element i would be read where another is written
    ({"output_name": "q"}, {}),  # the result comes back as another input than the one it updates
], ids=["plain", "read-later", "read-reversed", "another-name"])
def test_a_result_takes_the_memory_it_updates_only_where_each_element_is_read_where_it_is_written(spoilt, takes):
    assert in_place(_one_update(**spoilt)) == takes
