"""From a checked experiment to everything a run needs before its first step: the data, the
compiled program, the backend, the memory plan and the starting parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

import os

import numpy as np

from sexpgpu.backends.select import select_backend
from sexpgpu.graph import compile_program
from sexpgpu.plan.memory import plan_memory
from sexpgpu.run.feed import Feeder
from sexpgpu.run.state import TrainingState, initial_value, zero_optimizer_state


@dataclass
class BuiltRun:
    experiment: object
    program: object
    backend: object
    backend_facts: dict
    feeder: Feeder
    memory: dict
    data_identity: dict
    load_pins: list = field(default_factory=list)
    loaded: dict = field(default_factory=dict)  # path -> array read from a :load source
    choices: dict | None = None  # the `choices` record in effect (run/choosing.py)

    def initial_state(self) -> TrainingState:
        seed = self.experiment.run.seed
        params = {}
        for path, spec in self.program.params.items():
            params[path] = self.loaded[path] if path in self.loaded else initial_value(spec, seed)
            params[path] = self.backend.cast_parameter(params[path], spec.dtype)
        return TrainingState(0, params, zero_optimizer_state(self.program.training))

    def pass_name(self, pass_spec) -> str:
        return pass_spec.name or "eval"


def build_run(experiment, device: str, read_loads: bool = True, gpu: int | None = None) -> BuiltRun:
    run = experiment.run
    backend, facts = select_backend(device, run.arithmetic, gpu)
    feeder = Feeder(run, backend)
    program = compile_program(experiment, feeder.field_specs())
    feeder.attach(program)
    memory = {"microbatch": _peak_bytes(backend, program.training.micro),
              "update": _peak_bytes(backend, program.training.update)}
    built = BuiltRun(experiment, program, backend, facts, feeder, memory, feeder.identity())
    if read_loads:
        _read_loads(built)
    return built


def _peak_bytes(backend, graph) -> int:
    """The backend's own memory plan when it has one (CUDA's arena), else the graph's."""
    planner = getattr(backend, "memory_peak", None)
    return planner(graph) if planner is not None else plan_memory(graph).peak_bytes


def _read_loads(built: BuiltRun) -> None:
    from sexpgpu.store import load_parameter

    for path, spec in built.program.params.items():
        if spec.load is None:
            continue
        array, pin = load_parameter(load_source(built.experiment, spec), spec.load.tensor, tuple(spec.shape), path,
                                    dtype=spec.dtype)
        built.loaded[path] = np.ascontiguousarray(array, dtype=np.float32)
        built.load_pins.append(pin)


def load_source(experiment, spec) -> str:
    """Where a :load parameter's file is: an s3:// URI as written, a relative path joined to
    the experiment file's folder."""
    source = spec.load.source
    if source.startswith("s3://") or os.path.isabs(source):
        return source
    return os.path.normpath(os.path.join(os.path.dirname(experiment.path), source))


def checkpoint_root(run, options, run_dir: str, recorded: str | None = None) -> str:
    """Where checkpoints go: the command line's --checkpoint-to, else where the run directory
    records that the run being resumed wrote them (`recorded`), else the file's :to, else
    the run directory."""
    to = run.checkpoint.to if run.checkpoint is not None else None
    return next((root for root in (options.checkpoint_to, recorded, to) if root), run_dir)
