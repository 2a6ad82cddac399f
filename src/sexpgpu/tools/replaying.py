"""`sexpgpu replay` (docs/tools.md): a run's steps computed again from one of its checkpoints,
on this machine, pinned to the checkpoint's choices as a resume is, each step's loss bits and
parameter digest compared with what the run logged. The first step that differs is named:
this is how a machine is audited for silent data corruption, or a new driver checked to
keep level 2."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from sexpgpu.errors import SexpgpuError
from sexpgpu.run.checkpointing import expected_tensors
from sexpgpu.run.choosing import ChoiceSettings, choose, stacked_training
from sexpgpu.tools.comparing import METRICS, read_metrics
from sexpgpu.tools.evaluating import check_same_run, checkpoints_named, experiment_of
from sexpgpu.run.loop import Stacking, Trainer
from sexpgpu.run.report import row
from sexpgpu.run.setup import build_run
from sexpgpu.run.state import TrainingState
from sexpgpu.store import check_tensors, read_checkpoint, read_record
from sexpgpu.store.uris import is_s3

COMPARED = (("loss bits", "loss_bits"), ("digest", "digest"))


@dataclass(frozen=True)
class ReplayOptions:
    steps: int | None = None  # None: every logged step after the checkpoint
    metrics: str | None = None  # default: metrics.jsonl beside the checkpoint
    file: str | None = None
    device: str = "auto"
    out: object = None


@dataclass(frozen=True)
class Replayed:
    first: int  # the first step replayed
    last: int  # the last step replayed
    differing: int | None  # the first step that differs, or None
    what: str = ""  # how it differs


def replay(named: str, options: ReplayOptions) -> Replayed:
    """Replay from the checkpoint `named`, or from the oldest of a run directory's."""
    out = options.out or sys.stdout
    path = checkpoints_named([named])[0]
    record = read_record(path)
    experiment = experiment_of(path, record, options.file)
    built = build_run(experiment, options.device, read_loads=False)
    check_same_run(path, record, experiment, built)
    _check_one_process(path, record, experiment.run)
    metrics_path = options.metrics or _metrics_beside(path)
    logged, _ = read_metrics(_readable(metrics_path))
    checkpoint = read_checkpoint(path)
    check_tensors(checkpoint, expected_tensors(built))
    last = _last_step(checkpoint.step, logged, options.steps, metrics_path, experiment.run.steps)
    state = TrainingState.from_tensors(checkpoint.step, checkpoint.tensors).moved(built.backend.from_host)
    unstacked = Trainer(experiment.run, built.program, built.backend, built.feeder)
    chosen = choose(built, ChoiceSettings(), record, lambda: unstacked.first_inputs(built.initial_state()))
    built.backend.take_choices(chosen.choices)
    for label, text in chosen.report_lines():
        print(row(label, text), file=out)
    degree = chosen.choices.stacking
    trainer = Trainer(experiment.run, built.program, built.backend, built.feeder,
                      Stacking(stacked_training(built.program, degree), degree, pinned=True))
    while state.step < last:
        step = trainer.step(state)
        what = _difference(step, logged[step["step"]])
        if what:
            print(f"step {step['step']} differs from {metrics_path}: {what}", file=out, flush=True)
            return Replayed(checkpoint.step + 1, step["step"], step["step"], what)
    print(f"replayed steps {checkpoint.step + 1}..{last} from {path}: every step's loss bits and digest match "
          f"{metrics_path}", file=out, flush=True)
    return Replayed(checkpoint.step + 1, last, None)


def _check_one_process(path: str, record: dict, run) -> None:
    """Replay computes on one process. A float run on several grouped its sums by them
    (docs/distributed.md), so one process would report its first step as differing; an exact
    run's sums are the same on any number."""
    processes = record.get("world_size", 1)
    if processes != 1 and run.arithmetic != "exact":
        raise SexpgpuError("E-EVAL-008", f"{path} was written by a run on {processes} processes, whose gradients "
                                         "were summed in groups that replay, on one process, does not form: every "
                                         "step would differ from the log.",
                           hint="Replay a checkpoint of a run on one process, or resume the run on as many "
                                "processes (docs/distributed.md).")


def _metrics_beside(path: str) -> str:
    if is_s3(path):
        raise SexpgpuError("E-EVAL-006", f"{path} is on S3, and its run's {METRICS} is not: replay cannot find the "
                                         "steps to compare with.",
                           hint="Name the run's metrics file with --metrics FILE.")
    return os.path.join(os.path.dirname(os.path.normpath(path)), METRICS)


def _readable(path: str) -> str:
    if not os.path.isfile(path):
        raise SexpgpuError("E-EVAL-006", f"{path} is not there: replay needs the metrics the run logged to compare "
                                         "its steps with.",
                           hint="Name the run's metrics file with --metrics FILE.")
    return path


def _last_step(start: int, logged: dict, steps: int | None, metrics_path: str, run_steps: int) -> int:
    """The last step to replay: `steps` after the checkpoint, or every logged step after it."""
    if steps is not None and steps < 1:
        raise SexpgpuError("E-EVAL-007", f"--steps {steps}: replay computes at least one step.",
                           hint="Give --steps 1 or more, or leave it out to replay every logged step.")
    last = start + steps if steps is not None else max([step for step in logged if step > start], default=start)
    missing = [step for step in range(start + 1, last + 1) if step not in logged]
    if last == start or missing:
        after = f"step {missing[0]}" if missing else f"any step after {start}"
        raise SexpgpuError("E-EVAL-007", f"{metrics_path} holds no record of {after} (the run has {run_steps} steps), "
                                         "so there is nothing to compare a replayed step with.",
                           hint="Give fewer --steps, or a checkpoint the logged steps continue from.")
    return last


def _difference(replayed: dict, logged: dict) -> str:
    return "; ".join(f"{label} {replayed[key]}, logged {logged.get(key)}" for label, key in COMPARED
                     if replayed[key] != logged.get(key))
