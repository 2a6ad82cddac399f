"""The run loop's side of checkpoints: when to write one, what it records, and how a resume
checks that it continues the same run with the same bits. Storage itself is `sexpgpu.store`."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass

from sexpgpu import settings
from sexpgpu.errors import SexpgpuError
from sexpgpu.lang.serialize import experiment_to_json
from sexpgpu.run.nonfinite import nonfinite_stop
from sexpgpu.run.report import row
from sexpgpu.run.setup import load_source
from sexpgpu.run.state import TrainingState

# Parts of the resolved run that do not change a training step's bits. The microbatch layout
# is checked on its own (it decides which data a global microbatch index holds).
_NOT_BIT_RELEVANT = ("checkpoint", "passes", "microbatches", "path", "loc")
_LOAD_PATH = re.compile(r':load "(?:[^"\\]|\\.)*"')


@dataclass
class Resumed:
    state: TrainingState
    path: str
    annotation: str
    record: dict | None = None  # the checkpoint's experiment.json: its choices pin the resume


def due(run, step: int) -> bool:
    spec = run.checkpoint
    if spec is None:
        return False
    return step % spec.every == 0 or step == run.steps


def bit_identity(experiment, data_identity: dict) -> dict:
    """The resolved experiment without what cannot change a training step's bits. A `:load`
    path is left out too: the load pins check the bytes, wherever they now lie. So is a
    records file's path: the file counts by its size and SHA-256 (`data_identity`), so a
    resume from another folder, or naming it by another path, finds the same data."""
    resolved = experiment_to_json(experiment)
    run = {key: value for key, value in resolved["run"].items() if key not in _NOT_BIT_RELEVANT}
    if run["data"]["kind"] == "records":
        run["data"] = {"kind": "records", "shuffle": run["data"]["shuffle"],
                       "bytes": data_identity["bytes"], "sha256": data_identity["sha256"]}
    graphs = {name: dict(graph, body=[_LOAD_PATH.sub(':load "<pinned>"', form) for form in graph["body"]])
              for name, graph in resolved["graphs"].items()}
    return {"run": run, "graphs": graphs}


def identity_digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def checkpoint_record(built, state: TrainingState, options) -> dict:
    """experiment.json of a checkpoint. Its `experiment.resolved`, `selection`, `flags`,
    `environment` and `device` are what a resume compares (store.BIT_KEYS); `microbatches` and
    `world_size` are its layout (`_check_layout`); `world` (processes and nodes) is recorded,
    not compared, so a checkpoint written before it was still resumes."""
    run = built.experiment.run
    identity = bit_identity(built.experiment, built.data_identity)
    return {
        "experiment": {"resolved": identity, "digest": identity_digest(identity),
                       "name": run.name, "file": experiment_to_json(built.experiment)},
        "selection": run.name,
        "flags": options.flags.get("bits", {}),
        "environment": recorded_environment(options.flags.get("environment", {})),
        "device": built.backend_facts.get("kind", "cpu"),
        "step": state.step,
        "data_position": {"next_step": state.step + 1,
                          "next_record": state.step * run.microbatches * run.batch},
        "microbatches": run.microbatches,
        "world_size": options.world.size,
        "world": options.world.to_json(),
        "choices": built.choices,
        "backend": built.backend_facts["name"],
        "loads": [pin.to_json() for pin in built.load_pins],
    }


def recorded_environment(environment: dict) -> dict:
    """The settings that change bits as the run has them: those set (cli/commands.py), and
    SEXPGPU_PATTERNS always, its default too, so that a run with the default and a resume
    that says `on` agree, and one that says `off` does not (E-CKPT-002)."""
    return dict(environment, SEXPGPU_PATTERNS=settings.resolved("SEXPGPU_PATTERNS"))


def _patterns_recorded(recorded: dict) -> dict:
    """A checkpoint's record with its settings as a run records them now (settings.as_recorded)
    and SEXPGPU_PATTERNS: one written before the setting was always recorded ran no pattern
    graph (there were none), as a run under `off` does."""
    environment = recorded.get("environment")
    if not isinstance(environment, dict):
        return recorded
    return dict(recorded, environment={"SEXPGPU_PATTERNS": "off", **settings.as_recorded(environment)})


def save(built, state: TrainingState, root: str, options, note=None) -> str:
    """Write the state's checkpoint under `root`; `note` is told of a damaged one it replaced."""
    from sexpgpu.store import write_checkpoint

    keep = built.experiment.run.checkpoint.keep if built.experiment.run.checkpoint else None
    host = {name: built.backend.to_host(value) for name, value in state.tensors().items()}
    stop = nonfinite_stop(root)
    if stop is not None:  # a checkpoint holds only finite values: the last one written stays the last good one
        stop.check_checkpoint(state.step, host)
    bf16 = [f"param/{path}" for path, spec in built.program.params.items() if spec.dtype == "bf16"]
    return write_checkpoint(root, state.step, host, checkpoint_record(built, state, options), keep=keep, bf16=bf16,
                            note=note)


def resume_state(built, options, root: str) -> Resumed:
    """The state of the checkpoint `--resume` names (`latest`: the newest under `root`), checked."""
    from sexpgpu.store import (BIT_KEYS, check_same_experiment, check_tensors, read_checkpoint, recorded_pins,
                               resolve_checkpoint, uncommitted_after, verify_load_pin)

    path = resolve_checkpoint(options.resume, root)
    checkpoint = read_checkpoint(path)
    check_tensors(checkpoint, expected_tensors(built))
    recorded = checkpoint.experiment
    # an exact run's bits are the same on every device (docs/determinism.md, "Exact runs"):
    # its resume compares everything but the backend that wrote the checkpoint. The world
    # size is the layout's, checked with its own error and its own way past it (_check_layout).
    exact = built.experiment.run.arithmetic == "exact"
    bit_keys = tuple(key for key in BIT_KEYS if key != "world_size" and (key != "device" or not exact))
    check_same_experiment(_patterns_recorded(recorded), checkpoint_record(built, TrainingState(checkpoint.step, {}),
                                                                          options), bit_keys)
    layout_note = _check_layout(recorded, built.experiment.run, options, exact)
    pins = [verify_load_pin(pin, source=_current_source(built, pin)) for pin in recorded_pins(path, recorded)]
    built.load_pins = pins
    state = TrainingState.from_tensors(checkpoint.step, checkpoint.tensors).moved(built.backend.from_host)
    annotation = row("resumed from", f"{path} at step {checkpoint.step}")
    for pin in pins:
        annotation += f"; {pin.param} loaded from {pin.file} ({pin.version_kind} {pin.version})"
    if layout_note:
        annotation += "\n" + layout_note
    for step, where in uncommitted_after(path, checkpoint.step).items():
        note = (f"step-{step} at {where} was not committed (its write was interrupted): resuming from step "
                f"{checkpoint.step}; it is replaced when step {step} is written again")
        print(f"note: {note}", file=options.err or sys.stderr, flush=True)
        annotation += "\n" + row("not committed", note)
    return Resumed(state, path, annotation, recorded)


def expected_tensors(built) -> dict:
    """{name: TensorSpec} of what a checkpoint of this model and optimizer holds (see save)."""
    from sexpgpu.store import TensorSpec

    params = {f"param/{path}": TensorSpec(tuple(spec.shape), "BF16" if spec.dtype == "bf16" else "F32")
              for path, spec in built.program.params.items()}
    state = {name: TensorSpec(tuple(shape), "F32") for name, shape in built.program.training.state_shapes().items()}
    return {**params, **state}


def _current_source(built, pin) -> str | None:
    """The source the file now names for a pinned parameter: a copy of the same bytes
    elsewhere resumes, and the annotation names the new path."""
    spec = built.program.params.get(pin.param)
    return load_source(built.experiment, spec) if spec is not None and spec.load is not None else None


def _check_layout(recorded: dict, run, options, exact: bool) -> str | None:
    """E-RESUME-001 when the microbatch count or the number of processes changed: each changes
    how a step's sums are grouped, so the bits. An exact run's sums are exact whatever the
    number of processes adding them, so only its microbatch count counts."""
    before = (recorded.get("microbatches"), recorded.get("world_size"))
    now = (run.microbatches, options.world.size)
    if before == now or (exact and before[0] == now[0]):
        return None
    described = (f"the checkpoint was written with {before[0]} microbatches a step on {before[1]} process(es); "
                 f"this run has {now[0]} on {now[1]}")
    if not options.allow_layout_change:
        raise SexpgpuError(
            "E-RESUME-001",
            f"resuming would change which data a global microbatch index holds: {described}.",
            hint="Restore the file's :microbatches and start as many processes as wrote the checkpoint, or pass "
                 "--allow-layout-change to continue with bits that differ from the uninterrupted run's.",
        )
    return row("layout changed", f"{described}: the bits will differ from the uninterrupted run's")
