"""Captured graphs keep the optimizer's inputs inside the arena: the update's concatenation
of parameters then copies nothing, and the outputs are the same bits. Run on the CPU with
Triton's interpreter (the placement is a property of the lowering, not of the GPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sexpgpu.backends.cuda.backend import CudaBackend  # noqa: E402
from sexpgpu.backends.cuda.placement import placements  # noqa: E402
from sexpgpu.graph.frontend.records import Initializer, ParamSpec  # noqa: E402
from sexpgpu.graph.training.optimizers import build_update  # noqa: E402
from sexpgpu.lang.experiment import OptimizerSpec  # noqa: E402

pytestmark = pytest.mark.usefixtures("interpreted")  # tests/cuda/conftest.py

SHAPES = {"a/b": (5,), "a/w": (3, 5), "head": (2, 3)}




def _update():
    params = {path: ParamSpec(path, shape, "f32", Initializer("zeros"), None) for path, shape in SHAPES.items()}
    graph, _ = build_update(params, OptimizerSpec("adamw", lr=0.1, weight_decay=0.01, clip=1.0), 1)
    rng = np.random.default_rng(3)
    inputs = {name: rng.standard_normal(node.shape).astype(np.float32)
              for name, node in graph.inputs.items() if name not in ("step", "lr")}
    inputs.update({name: np.abs(value) for name, value in inputs.items() if name.startswith("state/v/")})
    inputs.update({"step": np.int32(2), "lr": np.float32(0.05)})
    return graph, inputs


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


def test_parameters_and_moments_that_come_back_lent_are_copied_in_whole():
    # The run loop hands the update its own lent outputs back as the next step's inputs: each
    # flat buffer of them is one copy into the flat input buffer, and the step keeps its bits.
    from sexpgpu.backends.cuda.runtime import Captured, _lendable, _returned

    graph, inputs = _update()
    backend = CudaBackend(device="cpu")
    executable = backend._entry(graph)[1]
    returned = _returned(executable.lowered, placements(executable.lowered))
    kinds = sorted(tuple({name.split("/")[1] if name.startswith("state/") else "param" for name in group.names})
                   for group in returned)
    assert kinds == [("m",), ("param",), ("v",)]  # one flat buffer each
    assert {name for group in returned for name in group.names} == {
        name for name in graph.inputs if name.startswith(("param/", "state/"))}
    accepted = {name: backend._accept(name, graph.inputs[name], value) for name, value in inputs.items()}
    captured = Captured(executable)
    captured.env, captured.returned = executable.static_environment(accepted), returned
    executable.execute(captured.env)
    lendable = _lendable(executable.lowered, captured.env)
    assert {name for group in returned for name in group.names} <= lendable
    lent = {name: captured.env[key] for name, key in executable.lowered.outputs.items() if name in lendable}
    again = {**accepted, **lent}
    # another backend's arena: an eager call of this executable would write over the lent buffers
    expected = CudaBackend(device="cpu")._entry(graph)[1]({name: value.clone() for name, value in again.items()})
    whole = captured._copy_returned(again)
    assert whole == {name for group in returned for name in group.names}
    rest = [name for name in executable.lowered.inputs if name not in whole]
    for name in rest:
        captured.env[executable.lowered.inputs[name]].copy_(again[name])
    executable.execute(captured.env)
    for name, key in executable.lowered.outputs.items():
        assert torch.equal(captured.env[key], expected[name]), name


def test_no_output_of_an_update_shares_memory_with_the_buffers_its_inputs_lie_in():
    # gpt-50m's new parameters once took the memory of the flat gradients, which die before
    # them: then they overlapped an input's buffer, could not be lent, and were copied out and
    # in again at every step (runtime.py's _lendable). Buffers that hold inputs live throughout.
    from pathlib import Path

    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    path = Path(__file__).resolve().parents[2] / "bench" / "gpt-50m.sexp"
    update = build_run(load_experiment(str(path)), "cpu").program.training.update
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
            assert b <= c or d <= a, (output, held)
