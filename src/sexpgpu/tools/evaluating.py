"""Offline evaluation (determinism.md, "Offline evaluation"): a run's passes computed from its
checkpoints, on this machine, unstacked.

Its choices are come by as a run's are (run/choosing.py), with the checkpoint in the place a
resume's record takes:
- on the kind of device the checkpoint's choices were made on it takes them (level 2), so its
  eval/* values are the bits the run reported inline; the CPU interpreter, which chooses
  nothing, repeats an inline CPU run's values on every machine (level 1);
- on another kind it chooses its own, measured and remembered (level 3);
- --choices and --deterministic replace either, as for a run; a pinned product shape with no
  recorded implementation stops with E-CHOICE-001, and --choices fresh chooses at level 3.
  (The checkpoint's own choices are not such a pin: a pass's product that training did not
  record ran ordinary inline, and takes ordinary here.)

Each evaluation is printed and recorded beside the checkpoint (store/evaluations.py) with
its annotation `evaluated offline on <device>: determinism <level>`.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from sexpgpu.version import __version__
from sexpgpu.errors import SexpgpuError
from sexpgpu.lang.forms import load_experiment
from sexpgpu.lang.serialize import experiment_to_json
from sexpgpu.plan.cache import open_cache
from sexpgpu.plan.choices import ORDINARY, Choices, Situation, choices_from_json, decide, take_pinned
from sexpgpu.plan.levels import How, determinism_line
from sexpgpu.run.checkpointing import bit_identity, expected_tensors, identity_digest
from sexpgpu.run import choosing
from sexpgpu.run.choosing import FRESH, ChoiceSettings, Chosen, choose, computes_exact, read_pinned
from sexpgpu.run.loop import Trainer
from sexpgpu.run.report import row
from sexpgpu.run.setup import build_run
from sexpgpu.run.state import TrainingState
from sexpgpu.store import check_tensors, list_checkpoints, read_checkpoint, read_record, resolve_checkpoint
from sexpgpu.store.evaluations import UnreadableEvaluations, add_evaluation, read_evaluations


@dataclass(frozen=True)
class EvaluateOptions:
    device: str = "auto"
    passes: tuple = ()  # the pass names to run; empty: every pass of the run
    file: str | None = None  # the experiment file, when it is no longer where the run read it
    choices: ChoiceSettings = field(default_factory=ChoiceSettings)
    out: object = None


@dataclass(frozen=True)
class Evaluation:
    checkpoint: str
    step: int
    values: list  # one record a pass, as the run's metrics.jsonl has them
    determinism: str  # the determinism line
    annotation: str  # "evaluated offline on <device>: determinism <level>"
    recorded_in: str


@dataclass(frozen=True)
class PassGraphs:
    """The pass graphs in the place of a training graph, for the product decisions: a pass's
    products are the shapes its choices are about (plan/choices.py's Situation reads `graphs`)."""

    graphs: tuple


def checkpoints_named(paths) -> list:
    """Each path a checkpoint, or a run directory (or checkpoint root) standing for all of its
    committed checkpoints, oldest first."""
    found = []
    for path in paths:
        inside = list_checkpoints(path)
        found += [where for _, where in inside] if inside else [resolve_checkpoint(path, path)]
    return found


def evaluate(paths, options: EvaluateOptions) -> list:
    out = options.out or sys.stdout
    return [evaluate_checkpoint(path, options, out) for path in checkpoints_named(paths)]


def evaluate_checkpoint(path: str, options: EvaluateOptions, out) -> Evaluation:
    record = read_record(path)
    with _readable_evaluations(path):  # one that cannot be added to stops before anything is computed
        read_evaluations(path)
    experiment = experiment_of(path, record, options.file)
    built = build_run(experiment, options.device, read_loads=False, holds="passes")
    check_same_run(path, record, experiment, built)
    passes = _selected_passes(path, experiment.run, options.passes)
    checkpoint = read_checkpoint(path)
    check_tensors(checkpoint, expected_tensors(built))
    chosen = evaluation_choices(built, options.choices, record, path)
    built.backend.take_choices(chosen.choices)
    state = TrainingState.from_tensors(checkpoint.step, checkpoint.tensors)
    state.params = {name: built.backend.from_host(value) for name, value in state.params.items()}
    print(row("evaluating", f"{path}: {experiment.run.name} at step {checkpoint.step} on {built.backend_facts['name']}"),
          file=out)
    for label, text in chosen.report_lines():
        print(row(label, text), file=out)
    trainer = Trainer(experiment.run, built.program, built.backend, built.feeder)
    values = [trainer.evaluate(state, spec, built.pass_name(spec)) for spec in passes]
    for value in values:
        print(json.dumps(value), file=out)
    line = determinism_line(chosen.how, chosen.choices.device)
    annotation = f"evaluated offline on {chosen.choices.device}: determinism {level_of(line)}"
    entry = {"annotation": annotation, "determinism": line, "choices": chosen.choices.to_json(), "values": values,
             "sexpgpu": __version__}
    with _readable_evaluations(path):
        recorded_in = add_evaluation(path, checkpoint.step, entry)
    print(f"{annotation} (recorded in {recorded_in})", file=out, flush=True)
    return Evaluation(path, checkpoint.step, values, line, annotation, recorded_in)


@contextmanager
def _readable_evaluations(path: str):
    try:
        yield
    except UnreadableEvaluations as error:
        raise SexpgpuError("E-EVAL-005", f"{error.where} is {error.reason}, so sexpgpu evaluate will not write "
                                         f"{path}'s evaluation over it.",
                           hint="Move the file aside and evaluate again; the checkpoint itself is untouched.") from None


def level_of(determinism: str) -> str:
    """The level a determinism line states: its first word ("1 on every machine: …" is 1)."""
    return determinism.split(":")[0].split()[0]


# --- which run ----------------------------------------------------------------------------

def experiment_of(path: str, record: dict, file: str | None):
    """The checkpoint's run, read again from its experiment file: the recorded path, or
    --file when the file has moved."""
    recorded = record.get("experiment", {}).get("file", {})
    source = file or recorded.get("path")
    if not source or not os.path.isfile(source):
        raise SexpgpuError("E-EVAL-001", f"{path} was written by a run of {recorded.get('path', 'an unnamed file')}, "
                                         "which is not there to read its passes from.",
                           hint="Give the experiment file with --file FILE.")
    return load_experiment(source, record.get("selection"))


def check_same_run(path: str, record: dict, experiment, built) -> None:
    """The file must still define the run that wrote the checkpoint, passes included."""
    recorded_passes = record.get("experiment", {}).get("file", {}).get("run", {}).get("passes")
    now_passes = experiment_to_json(experiment)["run"]["passes"]
    same_training = identity_digest(bit_identity(experiment, built.data_identity)) == record["experiment"].get("digest")
    if not same_training or recorded_passes != now_passes:
        changed = "its passes" if same_training else "its model, data, optimizer or schedule"
        raise SexpgpuError("E-EVAL-002", f"{experiment.path} no longer defines the run {experiment.run.name} that "
                                         f"wrote {path}: {changed} changed since.",
                           hint="Evaluate with the file as the run read it (--file FILE names a copy).")


def _selected_passes(path: str, run, names: tuple) -> list:
    if not run.passes:
        raise SexpgpuError("E-EVAL-003", f"the run {run.name} of {path} has no :passes: there is nothing to evaluate.",
                           hint="Add a pass to the defrun, such as :passes ((eval :every 50 :batches 4)).")
    by_name = {spec.name or "eval": spec for spec in run.passes}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise SexpgpuError("E-EVAL-004", f"--pass {unknown[0]}: the run {run.name} has the passes "
                                         f"{', '.join(by_name)}.",
                           hint="Name one of them, or leave out --pass to run them all.")
    return [by_name[name] for name in names] if names else list(run.passes)


# --- its choices --------------------------------------------------------------------------

def evaluation_choices(built, settings: ChoiceSettings, record: dict, path: str) -> Chosen:
    """The choices the passes run with, and how they were come by (the module's docstring)."""
    if settings.deterministic:
        return choose(built, settings, None)
    probe = choosing.backend_probe(built.backend)  # looked up at the call: tests stand a device in
    recorded = _recorded(record, path)
    explicit = settings.choices not in (None, FRESH)
    if probe is None:
        return _interpreter(built, settings, record, recorded, explicit)
    here = probe.device_facts().line()
    situation = _situation(probe, built, settings)
    if explicit:
        return _take(situation, read_pinned(settings.choices), settings.choices)
    if settings.choices is None and recorded is not None and recorded.device == here:
        return _take(situation, _as_run_inline(situation, recorded), f"the checkpoint {path}")
    program = built.program
    generators = [program.generator, *program.pass_generators.values()] if program.generator is not None else []
    # the cache is the run's, kept apart by the pass graphs: its product entries are keyed by shape
    cache = open_cache(probe.device_facts(), program.training, [*generators, *program.passes.values()])
    choices = decide(situation, cache)
    return Chosen(choices, How("elsewhere", _why_own(settings, recorded)), situation.notes + cache.notes)


def _recorded(record: dict, path: str) -> Choices | None:
    return None if record.get("choices") is None else choices_from_json(record["choices"], path)


def _situation(probe, built, settings: ChoiceSettings) -> Situation:
    """A pass runs unstacked, and its products are its own graphs' (PassGraphs)."""
    passes = PassGraphs(tuple(built.program.passes.values()))
    situation = Situation(probe, passes, False, 1, settings.node_gradients)
    situation.offered = (1,)
    return situation


def _take(situation: Situation, recorded: Choices, source: str) -> Chosen:
    """The recorded choices, unstacked and without the training's gradients between nodes,
    which no pass sends: E-CHOICE-001 when a pass's product has no recorded implementation."""
    unstacked = replace(recorded, stacking=1, node_gradients=None)
    return Chosen(take_pinned(situation, unstacked, source), How("pinned", source, recorded.device), situation.notes)


def _as_run_inline(situation: Situation, recorded: Choices) -> Choices:
    """The checkpoint's choices as its run's inline passes took them: a pass's product whose
    shape training did not record ran ordinary (the backend's default for a shape it was not
    given), so that is what this evaluation takes for it."""
    if recorded.products is None:
        return recorded
    unrecorded = {shape.key(): ORDINARY for shape in situation.product_shapes() if shape.key() not in recorded.products}
    return replace(recorded, products={**recorded.products, **unrecorded})


def _why_own(settings: ChoiceSettings, recorded: Choices | None) -> str:
    if settings.choices == FRESH:
        return "--choices fresh"
    if recorded is None:
        return "the checkpoint records no choices"
    return f"the checkpoint's choices were made on {recorded.device}"


def _interpreter(built, settings: ChoiceSettings, record: dict, recorded: Choices | None, explicit: bool) -> Chosen:
    """The CPU interpreter takes no choices: it repeats a CPU run's values on any machine, and
    a device run's distribution."""
    if explicit:
        read_pinned(settings.choices)  # a record that cannot be read is refused all the same
    name = built.backend_facts["name"]
    choices = Choices(name, False, 1, None, {}, {}, None)
    if record.get("device", "cpu") == "cpu" or computes_exact(built):  # exact: the same values on any device
        return choosing.interpreter_chosen(built, choices)
    made_on = recorded.device if recorded is not None else record.get("device")
    return Chosen(choices, How("elsewhere", f"the checkpoint's choices were made on {made_on}"))
