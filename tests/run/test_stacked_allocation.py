"""An allocation failure in a stacked step (determinism.md, "A run loses level 1"): an
unpinned run computes that step and the rest unstacked, with the same bits as a run that was
never stacked from there; a pinned run stops with the allocation error.

The stacked training graph is the same file compiled with k times the batch and 1/k the
microbatches: what a stack of k microbatches computes. The backend is the CPU interpreter,
made to run out of memory on that graph, as a GPU does when another process takes memory."""

from __future__ import annotations

import json

import pytest

from sexpgpu.backends.cpu import Interpreter
from sexpgpu.backends.cpu.facts import cpu_facts
from sexpgpu.cli.main import main
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph import compile_program
from sexpgpu.lang.forms import load_experiment
from sexpgpu.run import choosing, session, setup
from sexpgpu.run.feed import Feeder
from sexpgpu.run.loop import Stacking, Trainer
from sexpgpu.run.state import TrainingState, initial_value, zero_optimizer_state

from fake_device import FakeDevice
from test_cli import EXAMPLES


OUT_OF_MEMORY = {
    "host": MemoryError("out of memory"),
    "device": SexpgpuError("E-MEM-001", "memory: allocation failed: the memory plan's arena needs 4,096 bytes"),
}


class CrowdedDevice(Interpreter):
    """The interpreter, out of memory whenever it runs `graph`."""

    def __init__(self, graph, error=OUT_OF_MEMORY["host"]):
        super().__init__()
        self.graph, self.error = graph, error

    def run(self, graph, inputs, lent=False):
        if graph is self.graph:
            raise self.error
        return super().run(graph, inputs)


def tiny(tmp_path, batch: int, microbatches: int):
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    text = text.replace(":batch 64", f":batch {batch}").replace(":steps 200", f":steps 3 :microbatches {microbatches}")
    path = tmp_path / f"tiny-{batch}-{microbatches}.sexp"
    path.write_text(text)
    return load_experiment(str(path), None)


def trainer(experiment, backend, stacking=None, on_unstacked=None):
    feeder = Feeder(experiment.run, backend)
    program = compile_program(experiment, feeder.field_specs())
    feeder.attach(program)
    return Trainer(experiment.run, program, backend, feeder, stacking, on_unstacked), program


def start(program, seed):
    params = {path: initial_value(spec, seed) for path, spec in program.params.items()}
    return TrainingState(0, params, zero_optimizer_state(program.training))


@pytest.fixture
def runs(tmp_path):
    experiment = tiny(tmp_path, 64, 2)
    stacked = compile_program(tiny(tmp_path, 128, 1), {"x": ((2,), "f32"), "y": ((), "i32")}).training
    return experiment, stacked


@pytest.mark.parametrize("where", OUT_OF_MEMORY)
def test_an_unpinned_stacked_run_computes_unstacked_from_the_failing_step(runs, where):
    experiment, stacked = runs
    unstacked_at = []
    crowded, program = trainer(experiment, CrowdedDevice(stacked.micro, OUT_OF_MEMORY[where]), Stacking(stacked, 2),
                               unstacked_at.append)
    plain, _ = trainer(experiment, Interpreter())
    ours, theirs = start(program, experiment.run.seed), start(program, experiment.run.seed)
    for _ in range(3):
        assert crowded.step(ours) == plain.step(theirs)
    assert unstacked_at == [1] and crowded.stacking.degree == 1


def test_a_pinned_stacked_run_stops_with_the_allocation_error(runs):
    experiment, stacked = runs
    error = OUT_OF_MEMORY["device"]
    crowded, program = trainer(experiment, CrowdedDevice(stacked.micro, error), Stacking(stacked, 2, pinned=True))
    with pytest.raises(SexpgpuError, match="memory: allocation failed"):
        crowded.step(start(program, experiment.run.seed))


class CrowdedForStacks(Interpreter):
    """The interpreter, out of memory for any graph that takes twice the file's batch."""

    def run(self, graph, inputs, lent=False):
        if any(name.startswith("field/") and node.shape[0] == 128 for name, node in graph.inputs.items()):
            raise MemoryError("out of memory")
        return super().run(graph, inputs)


def test_the_run_says_memory_allocation_failed_and_records_stacking_1(tmp_path, monkeypatch, capsys):
    """Through main(): the fake device offers stacking 2, the backend cannot hold it. The
    stacked graph stands in for graph/training/stacking.py's (the file compiled with twice the batch)."""
    experiment = tiny(tmp_path, 64, 2)
    stacked = compile_program(tiny(tmp_path, 128, 1), {"x": ((2,), "f32"), "y": ((), "i32")}).training
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(choosing, "backend_probe", lambda backend: FakeDevice())
    monkeypatch.setattr(session, "stacked_training", lambda program, degree: stacked if degree == 2 else program.training)
    monkeypatch.setattr(setup, "select_backend", lambda device, gpu=None: (CrowdedForStacks(), cpu_facts()))
    code = main(["run", experiment.path, "--run-dir", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert code == 0
    assert "stacking 2," in out and "memory: allocation failed at step 1 with stacking 2" in err
    for record in ("r/step-3/experiment.json", "r/experiment.json"):
        assert json.loads((tmp_path / record).read_text())["choices"]["stacking"] == 1
