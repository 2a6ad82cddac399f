"""From a checked experiment to everything a run needs before its first step: the data, the
compiled program, the backend, the memory plan and the starting parameters.

The memory plan is checked against this machine (plan/fit.py) before anything large is
allocated: before a parameter is drawn, a batch read or a :load tensor read."""

from __future__ import annotations

from dataclasses import dataclass, field

import os

import numpy as np

from sexpgpu import settings
from sexpgpu.backends.select import run_facts, select_backend
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph import compile_program
from sexpgpu.plan.fit import (DEVICE_SHARE, HOST_SHARE, Room, check_fits, held_on_device, host_need, host_room,
                              largest_tensors)
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


def build_run(experiment, device: str, read_loads: bool = True, gpu: int | None = None,
              holds: str | None = "training") -> BuiltRun:
    """`holds`: what the command will run, a key of HOLDINGS, whose memory must fit this
    machine (E-MEM-002); None checks nothing (`sexpgpu check` warns instead)."""
    run = experiment.run
    backend, facts = select_backend(device, gpu=gpu)
    facts = run_facts(facts, run.arithmetic)
    feeder = Feeder(run, backend)
    program = compile_program(experiment, feeder.field_specs())
    feeder.attach(program)
    memory = {"microbatch": backend.memory_peak(program.training.micro),
              "update": backend.memory_peak(program.training.update)}
    built = BuiltRun(experiment, program, backend, facts, feeder, memory, feeder.identity())
    problem = memory_problem(built, holds) if holds is not None else None
    if problem is not None:
        raise problem
    if read_loads:
        _read_loads(built)
    return built


def _training(program) -> tuple:
    """A run's graphs, and what it keeps between their calls: the parameters, the optimizer
    state, and a step's running gradient sum when it has several microbatches."""
    training = program.training
    keeps = ("param/", "state/", "grad/") if training.microbatches > 1 else ("param/", "state/")
    held = {name: node.nbytes for name, node in training.update.inputs.items() if name.startswith(keeps)}
    return (*training.graphs, *program.passes.values(), *_generators(program)), held


def _passes(program) -> tuple:
    """An offline evaluation's graphs (the passes and their data's generators), and the parameters."""
    held = {name: node.nbytes for name, node in program.training.update.inputs.items() if name.startswith("param/")}
    return (*program.passes.values(), *_generators(program)), held


def _generators(program) -> tuple:
    return (*([program.generator] if program.generator is not None else []), *program.pass_generators.values())


HOLDINGS = {"training": _training, "passes": _passes}


def memory_problem(built: BuiltRun, holds: str = "training") -> SexpgpuError | None:
    """E-MEM-002 when what the command runs (a key of HOLDINGS) cannot fit this machine's
    memory (plan/fit.py): the host's for the CPU interpreter, the device's free memory for
    a device backend; else None."""
    graphs, held = HOLDINGS[holds](built.program)
    largest = largest_tensors(graphs, built.experiment.run.batch, built.program.params)
    probe = built.backend.probe()
    if probe is None:
        need, room, share = host_need(graphs, held), host_room(settings.value("SEXPGPU_HOST_MEMORY")), HOST_SHARE
    else:
        running = sum(size for name, size in held.items() if name.startswith("grad/"))
        need, share = held_on_device(graphs, built.backend.memory_peak, running), DEVICE_SHARE
        room = Room(probe.free_memory_bytes(), "the GPU memory free now")
    try:
        check_fits(need, room, largest, share)
    except SexpgpuError as problem:
        return problem
    return None


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
