"""A whole run: compile, report, initialise or resume, train, evaluate, checkpoint.

The run directory holds `experiment.json` (the resolved experiment and flags, and where the
checkpoints go, which a resume's `latest` searches),
`report.txt` (the lowering report), `metrics.jsonl`, `run.lock` (rundir.py), and `step-<n>/`
checkpoints unless the file or the command line sends them elsewhere.

On several processes (distributed/world.py) every process trains, and process 0 alone claims and
writes the run directory, prints the report and the progress, runs the passes and writes the
checkpoints; what fails there stops the others too, with the same code.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import NamedTuple

from sexpgpu import settings
from sexpgpu.errors import SexpgpuError
from sexpgpu.files import write_atomically
from sexpgpu.lang.serialize import experiment_to_json
from sexpgpu.run.choosing import (ChoiceSettings, agreed, choice_settings, choose, computes_exact, lowering_annotation,
                                  stacked_training)
from sexpgpu.run.loop import Stacking, Trainer
from sexpgpu.run.metrics import MetricsLog, truncate_after_step
from sexpgpu.run.nonfinite import nonfinite_stop
from sexpgpu.run.progress import Progress
from sexpgpu.run.report import lowering_report
from sexpgpu.run.rundir import (Made, checkpoints_to_record, claimed, default_run_dir, recorded_checkpoints,
                                run_dir_errors, same_place, unused_sibling)
from sexpgpu.run.setup import build_run, checkpoint_root
from sexpgpu.run.stopping import Stop, stop_of
from sexpgpu.distributed.world import World, joined, process_device
from sexpgpu.run import checkpointing
from sexpgpu.store import s3_waiting_lines_to
from sexpgpu.store.uris import parent


# Settings that change a run's bits by design (determinism.md, "What the run's configuration decides").
# The choice settings (SEXPGPU_CHOICES, SEXPGPU_DETERMINISTIC, SEXPGPU_NODE_GRADIENTS) are not
# among them: a resume's choices are checked by its pin (E-CHOICE-001), not its identity.
BIT_SETTINGS = ("SEXPGPU_OPTIMIZE", "SEXPGPU_PATTERNS")


def run_flags(device: str, choices: ChoiceSettings) -> dict:
    """What a run records of its command line: the device (the backend records what it is),
    the flags that change bits (none yet), the settings in the environment that do, and the
    choice settings."""
    return {"device": device, "bits": {},
            "environment": settings.recorded(BIT_SETTINGS),
            "choices": choices.to_json()}


@dataclass
class RunOptions:
    run_dir: str | None = None
    device: str = "auto"
    resume: str | None = None
    checkpoint_to: str | None = None
    allow_layout_change: bool = False
    flags: dict = field(default_factory=dict)
    choices: ChoiceSettings = field(default_factory=ChoiceSettings)
    world: World = World.SOLO  # this process among the run's (torchrun's environment)
    out: object = None  # where the report goes (stdout)
    err: object = None  # where progress goes (stderr)

    @classmethod
    def from_flags(cls, device: str = "auto", choices: str | None = None, deterministic: bool = False,
                   **places) -> RunOptions:
        """What `sexpgpu run`'s flags ask for, and the Python API's `train` with them: the choice
        settings (the flags over the environment's), the flags a run records, and this process
        among torchrun's. `places` are the other fields: run_dir, resume, checkpoint_to, ..."""
        taken = choice_settings(choices, deterministic)
        return cls(device=device, flags=run_flags(device, taken), choices=taken, world=World.from_environment(),
                   **places)


@dataclass
class RunOutcome:
    run_dir: str
    final_step: int
    stop: Stop | None  # what stopped the run before its last step (Ctrl-C, SIGTERM), or None
    last_checkpoint: str | None


class Places(NamedTuple):
    """Where a run writes: its run directory, and the root of its checkpoints."""

    run_dir: str
    root: str


def execute(experiment, options: RunOptions) -> RunOutcome:
    out = options.out or sys.stdout
    err = options.err or sys.stderr
    world = options.world
    world.check_share(experiment.run.microbatches)
    kind = process_device(world, options.device) if world.distributed else None
    with joined(world, kind) as group:
        built = build_run(experiment, kind or options.device, gpu=group.gpu)
        group.check_same("the run and its settings", _started_as(built, options))
        made = Made()  # what a run refused before its first step removes again (rundir.py)
        run_dir = group.from_first(lambda: options.run_dir or default_run_dir(experiment.run.name, made),
                                   "sharing the run directory")
        # a resume finds the checkpoints where the run directory says the run wrote them
        root = group.from_first(lambda: checkpoint_root(experiment.run, options, run_dir,
                                                        recorded_checkpoints(run_dir) if options.resume else None),
                                "sharing the checkpoint destination")
        with ExitStack() as held:
            with group.settled("setting the run up"):
                if group.first:
                    held.enter_context(claimed(run_dir, root, fresh=not options.resume,
                                               writes_checkpoints=experiment.run.checkpoint is not None, made=made))
                resumed = checkpointing.resume_state(built, options, root) if options.resume else None
                chosen = choose(built, options.choices, resumed.record if resumed is not None else None,
                                lambda: _first_step_inputs(built), world)
            chosen = agreed(chosen, group)
            built.choices = chosen.choices.to_json()
            built.backend.take_choices(chosen.choices)
            report = lowering_report(experiment, built.program, built.backend_facts, built.memory, built.data_identity,
                                     chosen.report_lines())
            if resumed is not None:
                report += "\n" + resumed.annotation
            with group.settled("writing the run's files"):
                if group.first:
                    for name in ("experiment.json", "report.txt", "lowering.json"):
                        made.file(os.path.join(run_dir, name))
                    with run_dir_errors(run_dir, "write the run's files in"):
                        _write_run_files(Places(run_dir, root), experiment, built, options, report)
                        _write_json(os.path.join(run_dir, "lowering.json"), lowering_annotation(report, chosen))
                    print(report, file=out, flush=True)
            made.keep()  # from the first step on, what the run wrote is its record
            return _train(experiment, built, resumed, Places(run_dir, root), options, err, chosen, group)


def _started_as(built, options) -> bytes:
    """What every process of a run must have alike: the run's bit identity and selection,
    its flags and settings (SEXPGPU_NODE_GRADIENTS among them; SEXPGPU_NONFINITE, which orders a
    step's exchanges), and what it resumes."""
    identity = checkpointing.identity_digest(checkpointing.bit_identity(built.experiment, built.data_identity))
    return json.dumps({"identity": identity, "selection": built.experiment.run.name, "flags": options.flags,
                       "nonfinite": settings.resolved("SEXPGPU_NONFINITE"),
                       "resume": options.resume, "checkpoint_to": options.checkpoint_to,
                       "allow_layout_change": options.allow_layout_change}, sort_keys=True).encode()


def _write_run_files(places, experiment, built, options, report) -> None:
    run_dir = places.run_dir
    resolved = {
        "experiment": experiment_to_json(experiment),
        "flags": options.flags,
        "data": built.data_identity,
        "loads": [pin.to_json() for pin in built.load_pins],
        "choices": built.choices,
        "checkpoints": checkpoints_to_record(places.root, run_dir),
        "world": options.world.to_json(),
    }
    _write_json(os.path.join(run_dir, "experiment.json"), resolved)
    write_atomically(os.path.join(run_dir, "report.txt"), report + "\n")


def _first_step_inputs(built) -> dict:
    trainer = Trainer(built.experiment.run, built.program, built.backend, built.feeder)
    return trainer.first_inputs(built.initial_state())


def _record_choices(path: str, choices: dict) -> None:
    """The run directory's experiment.json records the choices in effect."""
    with open(path, encoding="utf-8") as handle:
        resolved = json.load(handle)
    _write_json(path, dict(resolved, choices=choices))


def _write_json(path: str, content: dict) -> None:
    write_atomically(path, json.dumps(content, indent=2, sort_keys=True) + "\n")


class _Silent:
    """The metrics log and the progress of a process other than process 0: they write nothing."""

    def _nothing(self, *args) -> None:
        pass

    write = sync = close = update = note = finish = _nothing


def _train(experiment, built, resumed, places, options, err, chosen, group) -> RunOutcome:
    run, run_dir = experiment.run, places.run_dir
    state = resumed.state if resumed is not None else built.initial_state()
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if options.resume and group.first:
        torn = truncate_after_step(metrics_path, state.step).note(metrics_path)
        if torn:
            print(torn, file=err, flush=True)
    metrics = MetricsLog(metrics_path, append=bool(options.resume)) if group.first else _Silent()
    degree = chosen.choices.stacking
    # on several processes a stacking is never given up on one of them alone: each must sum as the others do
    stacking = Stacking(stacked_training(built.program, degree), degree, chosen.pinned or group.world.several)

    def unstacked(step: int) -> None:
        print(f"memory: allocation failed at step {step} with stacking {degree}; computing unstacked from this "
              "step on", file=err, flush=True)
        chosen.unstacked()
        built.choices = chosen.choices.to_json()
        _record_choices(os.path.join(run_dir, "experiment.json"), built.choices)

    trainer = Trainer(run, built.program, built.backend, built.feeder, stacking, unstacked)
    trainer.across = group.across(trainer.sums, chosen.choices.node_gradients, computes_exact(built))
    progress = Progress(run.steps, state.step + 1, run.batch * run.microbatches, stream=err) if group.first \
        else _Silent()
    trainer.nonfinite = nonfinite_stop(places.root)
    # until this run writes one, the checkpoint it resumed from is the one to continue from
    last_checkpoint = resumed.path if resumed is not None else None
    try:
        with s3_waiting_lines_to(progress.note):  # a stalled S3 request says so beside the progress
            while state.step < run.steps:
                record = trainer.step(state)
                group.check_parameters(state.step, record["digest"])
                with group.settled(f"writing step {state.step}"):
                    if group.first:
                        last_checkpoint = _after_step(trainer, built, state, record, metrics, progress, places.root,
                                                      options) or last_checkpoint
    except KeyboardInterrupt as interrupt:
        progress.finish()
        metrics.close()
        stop = stop_of(interrupt)
        if group.first:
            print(_stopped_message(experiment, options, places, stop, state.step, last_checkpoint), file=err,
                  flush=True)
        return RunOutcome(run_dir, state.step, stop, last_checkpoint)
    progress.finish()
    metrics.close()
    if group.first:
        print(f"done: {state.step} steps; run directory {run_dir}", file=err, flush=True)
    return RunOutcome(run_dir, state.step, None, last_checkpoint)


def _after_step(trainer, built, state, record, metrics, progress, root, options) -> str | None:
    """What process 0 does after a step: the metrics line, the passes due, the checkpoint
    due (its path, else None)."""
    run = built.experiment.run
    metrics.write(record)
    if trainer.diagnostics is not None:
        metrics.write(trainer.diagnostics)
    progress.update(state.step, record["loss"])
    for pass_spec in run.passes:
        if state.step % pass_spec.every == 0 or state.step == run.steps:
            evaluation = trainer.evaluate(state, pass_spec, built.pass_name(pass_spec))
            metrics.write(evaluation)
            progress.note(_describe_evaluation(evaluation))
    if not checkpointing.due(run, state.step):
        return None
    metrics.sync()
    written = checkpointing.save(built, state, root, options, note=progress.note)
    progress.note(f"checkpoint step {state.step} -> {written}")
    return written


def _describe_evaluation(record: dict) -> str:
    values = ", ".join(f"{key} {value:.6g}" for key, value in record.items() if key != "step")
    return f"step {record['step']}: {values}"


def _stopped_message(experiment, options, places, stop, step, last_checkpoint) -> str:
    """Where the run stopped, and a command that continues it: from the last checkpoint (the
    one it resumed from, if it wrote none), else a fresh start where a fresh run may start."""
    where = (f"stopped by {stop.name} after step {step} of {experiment.run.steps}; the metrics log in "
             f"{places.run_dir} is complete to that step.")
    if last_checkpoint:
        resume = "latest" if same_place(parent(last_checkpoint), places.root) else last_checkpoint
        return (f"{where} The last checkpoint is {last_checkpoint}; continue with: "
                f"{_command(experiment, options, places.run_dir, resume)}")
    # a fresh run refuses a directory holding this run's files (E-RUN-001): another one, or a new default
    again = unused_sibling(places.run_dir) if options.run_dir else None
    return (f"{where} No checkpoint was written, so there is nothing to resume; start the run again with: "
            f"{_command(experiment, options, again, None)}")


def _command(experiment, options, run_dir: str | None, resume: str | None) -> str:
    """The `sexpgpu run` command line that repeats this run's own flags, in `run_dir`, resuming from `resume`."""
    words = ["sexpgpu", "run", experiment.path, experiment.run.name]
    for flag, value, given in (("--run-dir", run_dir, run_dir), ("--device", options.device, options.device != "auto"),
                               ("--checkpoint-to", options.checkpoint_to, options.checkpoint_to),
                               ("--resume", resume, resume)):
        words += [flag, value] if given else []
    return shlex.join(words + (["--allow-layout-change"] if options.allow_layout_change else []))
