"""Graphs and runs for the tests of bound inputs (runtime.py's Binding): a graph reading the
parameters an update lends, steps of the two as the run loop makes them, and a small tiny-adam
trained by the run loop itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sexpgpu.backends.cuda.backend import CudaBackend
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.lang.forms import load_experiment
from sexpgpu.run.loop import Trainer
from sexpgpu.run.setup import build_run

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {"a/b": (5,), "a/w": (3, 5), "head": (2, 3)}


def reader_graph(shapes: dict = SHAPES, own: bool = False):
    """A graph reading the parameters: grad/<path> = -param/<path> squared, or, `own`, its new
    param/<path> (then its lent outputs come back as its own inputs, not placed anywhere)."""
    emit = Emitter()
    params = {f"param/{path}": emit.input(f"param/{path}", "f32", shape) for path, shape in shapes.items()}
    outputs = {(name if own else "grad/" + name[len("param/"):]): emit("mul", node, emit("neg", node))
               for name, node in params.items()}
    return emit.graph(params, outputs)


def pair_steps(backend, update, reader, inputs: dict, count: int, change=lambda step, given: given) -> list:
    """`count` steps of a reader call and an update call, the update's lent parameters read by
    the next reader call (through `change`), as the run loop does; each step's outputs on the host."""
    given, seen = dict(inputs), []
    for step in range(count):
        read = backend.run(reader, change(step, {name: given[name] for name in reader.inputs}), lent=True)
        outputs = backend.run(update, {**given, **read}, lent=True)
        # copies: on the CPU, to_host gives a view of a lent buffer, which the next call writes over
        seen.append({name: backend.to_host(value).copy() for name, value in {**read, **outputs}.items()})
        given = {**given, **{name: value for name, value in outputs.items() if name in given}}
    return seen


def copying_pair_steps(update, reader, inputs: dict, count: int, change=lambda step, given: given, device=None) -> list:
    """pair_steps on a backend that captures nothing: every input copied, every output its own."""
    backend = CudaBackend(device=device)
    backend.capture = False
    return pair_steps(backend, update, reader, inputs, count, change)


def trained(backend, folder: Path, steps: int = 4, batch: str = ":batch 8") -> tuple[list, dict, object]:
    """tiny-adam, made small (8 hidden units, `batch` for its :batch 64), trained `steps` steps:
    each step's loss bits, the final parameters and state, and the training graphs."""
    examples = ROOT / "examples"
    text = (examples / "tiny-adam.sexp").read_text().replace('"data/', f'"{examples}/data/')
    path = folder / "tiny.sexp"
    path.write_text(text.replace(":hidden 64", ":hidden 8").replace(":batch 64", batch))
    built = build_run(load_experiment(str(path)), "cpu")
    built.backend = built.feeder.backend = backend
    state = built.initial_state()
    trainer = Trainer(built.experiment.run, built.program, backend, built.feeder)
    losses = [trainer.step(state)["loss_bits"] for _ in range(steps)]
    final = {name: backend.to_host(value) for name, value in {**state.params, **state.optimizer}.items()}
    return losses, final, built.program.training


def assert_same_bits(got: dict, want: dict) -> None:
    """Every value of `want` has the bits of the value of its name in `got` (tensors or arrays)."""
    for name in want:
        assert np.array_equal(_bits(got[name]), _bits(want[name])), name


def _bits(value) -> np.ndarray:
    return np.asarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value).view(np.uint32)
