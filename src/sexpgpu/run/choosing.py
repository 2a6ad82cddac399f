"""The run's side of its choices: which way they are come by (its own, measured or from the
cache; a pinned record; --deterministic's fixed rules), the report's lines, and the stacked
training graph the loop runs. The decisions themselves are plan/choices.py's."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

from sexpgpu import settings as environment_settings  # `settings` below is a ChoiceSettings
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.training.stacking import stack_training
from sexpgpu.plan.cache import open_cache
from sexpgpu.plan.choices import (
    DEFAULT_NODE_GRADIENTS,
    STRICT_RECOMPUTE,
    Choices,
    Situation,
    choices_from_json,
    decide,
    decide_strictly,
    exact_stacking,
    node_gradients,
    node_gradients_refused,
    take_pinned,
)
from sexpgpu.plan.levels import How, Spread, choices_line, determinism_line, spread_clause
from sexpgpu.distributed.world import World
from sexpgpu.store import read_record

FRESH = "fresh"


@dataclass(frozen=True)
class ChoiceSettings:
    """--choices / SEXPGPU_CHOICES, --deterministic / SEXPGPU_DETERMINISTIC and
    SEXPGPU_NODE_GRADIENTS. None of them is part of a resume's identity check: a resume's
    choices are checked by the pin instead."""

    choices: str | None = None  # None (a run's own, a resume's checkpoint's), "fresh", or a record
    deterministic: bool = False
    node_gradients: str = DEFAULT_NODE_GRADIENTS
    node_gradients_set: bool = False  # SEXPGPU_NODE_GRADIENTS given explicitly

    def to_json(self) -> dict:
        return {"choices": self.choices, "deterministic": self.deterministic, "node_gradients": self.node_gradients}


def choice_settings(flag_choices: str | None, flag_deterministic: bool, environ=None) -> ChoiceSettings:
    """The command line wins over the environment, whose settings are read as every setting
    is (settings.py: a blank one is unset)."""
    gradients = environment_settings.value("SEXPGPU_NODE_GRADIENTS", environ)
    return ChoiceSettings(
        choices=flag_choices or environment_settings.value("SEXPGPU_CHOICES", environ),
        deterministic=flag_deterministic or environment_settings.value("SEXPGPU_DETERMINISTIC", environ) == "1",
        node_gradients=gradients or DEFAULT_NODE_GRADIENTS,
        node_gradients_set=gradients is not None,
    )


@dataclass
class Chosen:
    choices: Choices
    how: How
    notes: list = field(default_factory=list)
    described: str | None = None  # the backend's own choices line, for a backend with no probe yet
    patterns: str | None = None  # the report's patterns line, for a backend with a probe
    spread: Spread = field(default_factory=Spread)  # the processes the run spans

    @property
    def pinned(self) -> bool:
        return self.how.mode == "pinned"

    def determinism(self) -> str:
        return determinism_line(self.how, self.choices.device) + spread_clause(self.spread)

    def report_lines(self) -> list:
        """(label, text) pairs: how the choices were made, then the closing two lines."""
        lines = [("choosing", note) for note in self.notes]
        lines += [("patterns", self.patterns)] if self.patterns is not None else []
        return lines + [("determinism", self.determinism()),
                        ("choices", self.described or choices_line(self.choices))]

    def unstacked(self) -> None:
        self.choices = replace(self.choices, stacking=1)


def backend_probe(backend):
    """The backend's DeviceProbe, or None for a backend that decides nothing (the CPU
    interpreter). Tests replace this to run the whole path with a device they describe."""
    return backend.probe()


def computes_exact(built) -> bool:
    """Whether the run is `:arithmetic exact`: then no choice of the plan changes a bit."""
    return built.experiment.run.arithmetic == "exact"


def choose(built, settings: ChoiceSettings, resumed_record: dict | None, first_step_inputs=dict,
           world: World = World.SOLO) -> Chosen:
    """The run's choices, or E-CHOICE-001/002/003 before its first step; on several
    processes, with their count in the recorded device."""
    chosen = _chosen(built, settings, resumed_record, first_step_inputs, world)
    suffix = world.described(built.backend_facts.get("kind", "cpu"))
    if suffix:
        chosen.choices = replace(chosen.choices, device=f"{chosen.choices.device}, {suffix}")
        chosen.described = chosen.described and f"{chosen.described}; on {suffix}, whose number changes no bit"
    chosen.spread = Spread(world.size, world.nodes, chosen.choices.node_gradients, computes_exact(built),
                           resumed_record is not None)
    return chosen


def agreed(chosen: Chosen, group) -> Chosen:
    """Every process takes the choices of process 0, which its report and records state: a
    measured choice (a stacking timed at the first step) may come out otherwise on another
    GPU, and every process must sum in the same order."""
    first = json.loads(group.from_first(lambda: json.dumps(chosen.choices.to_json()), "sharing the choices"))
    if first != json.loads(json.dumps(chosen.choices.to_json())):
        chosen.choices = choices_from_json(first, "process 0")
    return chosen


def _chosen(built, settings: ChoiceSettings, resumed_record: dict | None, first_step_inputs, world: World) -> Chosen:
    _refuse_contradictions(settings)
    program = built.program
    probe = None if computes_exact(built) else backend_probe(built.backend)
    pinned = _pin(settings, resumed_record)
    if probe is None:
        return _interpreter_choices(built, settings, pinned, world)
    # each process stacks its own share of the microbatches; on several GPUs the measured
    # product and engine choices are rules (plan/choices.py)
    situation = Situation(probe, program.training, program.stackable, program.training.microbatches // world.size,
                          settings.node_gradients, gpus=world.size, nodes=world.nodes,
                          first_step_inputs=first_step_inputs, passes=tuple(program.passes.values()))
    if settings.deterministic:
        chosen = Chosen(decide_strictly(situation), How("strict"), situation.notes)
    elif pinned is not None:
        record, source = pinned
        chosen = Chosen(take_pinned(situation, record, source), How("pinned", source, record.device), situation.notes)
    else:
        generators = [program.generator, *program.pass_generators.values()] if program.generator is not None else []
        cache = open_cache(probe.device_facts(), program.training, generators)
        choices = decide(situation, cache)
        notes = situation.notes + cache.notes + _cache_notes(cache)
        chosen = Chosen(choices, replace(_own_or_rechosen(settings, resumed_record), forgets=cache.forgets), notes)
    chosen.patterns = _patterns(probe, situation)
    return chosen


def _patterns(probe, situation: Situation) -> str:
    """The patterns line: those on, and what the lowering of the graphs the run executes (at
    the stacking chosen) does with each group they match."""
    return probe.patterns_line((*situation.running_training().graphs, *situation.passes))


def _refuse_contradictions(settings: ChoiceSettings) -> None:
    """--deterministic takes fixed rules: no record to pin to, none to choose afresh, and f32
    between nodes (determinism.md, "Pinning a run to recorded choices")."""
    if not settings.deterministic:
        return
    if settings.choices is not None:
        taking = "choose them afresh here (--choices fresh)" if settings.choices == FRESH else \
            f"take the recorded choices of {settings.choices}"
        raise SexpgpuError("E-CHOICE-002", f"--deterministic takes fixed rules for every choice, so it cannot also "
                                           f"{taking}.",
                           hint="Leave out --choices (and SEXPGPU_CHOICES), or --deterministic "
                                "(and SEXPGPU_DETERMINISTIC).")
    if settings.node_gradients_set and settings.node_gradients == "bf16":
        raise SexpgpuError("E-CHOICE-002", "--deterministic sends f32 gradients between nodes, and "
                                           "SEXPGPU_NODE_GRADIENTS=bf16 asks for bf16.",
                           hint="Unset SEXPGPU_NODE_GRADIENTS or set it to f32, or leave out --deterministic.")


def _pin(settings: ChoiceSettings, resumed_record: dict | None):
    """(record, source) the run is pinned to, or None when it chooses its own."""
    if settings.choices == FRESH:
        return None
    if settings.choices is not None:
        return read_pinned(settings.choices), settings.choices
    if resumed_record is not None and resumed_record.get("choices") is not None:
        return choices_from_json(resumed_record["choices"], "the checkpoint resumed from"), "the checkpoint resumed from"
    return None


def _own_or_rechosen(settings: ChoiceSettings, resumed_record: dict | None) -> How:
    if resumed_record is None:
        return How("own")
    if settings.choices == FRESH:
        return How("rechosen", "--choices fresh")
    return How("rechosen", "its checkpoint records no choices")


def _cache_notes(cache) -> list:
    if cache.root is None:
        return []
    notes = []
    if cache.taken:
        notes.append(f"{_decisions(cache.taken)} taken from {cache.root}")
    if cache.made:
        notes.append(f"{_decisions(cache.made)} chosen now (not found in {cache.root})")
    return notes


def _decisions(keys) -> str:
    """The decisions that cache keys are about, each once (one entry per convolution)."""
    return ", ".join(dict.fromkeys(key.split("/")[0] for key in keys))


def _interpreter_choices(built, settings: ChoiceSettings, pinned, world: World = World.SOLO) -> Chosen:
    """A backend without a probe decides nothing: stacking 1, no fusion planner, no products
    of its own to choose (the CPU interpreter). A pinned record must ask for nothing else,
    unless the run is exact, where no choice changes a bit and a pin has nothing to hold."""
    device = built.backend_facts["name"]
    gradients = node_gradients(world.nodes, settings.node_gradients, settings.deterministic)
    choices = Choices(device, settings.deterministic, 1, None, {}, {}, gradients)
    if computes_exact(built):
        return exact_chosen(built, choices, world)
    if pinned is not None:
        record, source = pinned
        reasons = [(key, reason) for key, reason in (
            ("stacking", f"stacking {record.stacking}: the CPU interpreter runs unstacked" if record.stacking != 1
             else None),
            ("node_gradients", node_gradients_refused(world.nodes, settings.node_gradients, record.node_gradients)),
        ) if reason]
        if reasons:
            key, reason = reasons[0]
            raise SexpgpuError("E-CHOICE-001", f"this run is pinned to the choices of {source} and cannot take its "
                                               f"{key}: {reason}.",
                               hint="Run with --choices fresh to choose again here (level 3).")
    if not built.backend.takes_choices:
        return interpreter_chosen(built, choices)
    # a backend with no probe yet measures nothing: it states its fixed choices itself
    choices = replace(choices, recompute=STRICT_RECOMPUTE)
    described = built.backend_facts["choices"]
    if settings.deterministic:
        return Chosen(choices, How("strict"), described=described)
    if pinned is not None:
        return Chosen(choices, How("pinned", pinned[1], pinned[0].device), described=described)
    return Chosen(choices, How("own"), described=described)


def exact_chosen(built, choices: Choices, world: World = World.SOLO) -> Chosen:
    """An exact run's choices: none that changes a bit. The CPU interpreter runs unstacked; a
    device backend stacks its process's share of a step's microbatches into one call where
    the program allows (plan/choices.py's exact_stacking)."""
    if not built.backend.takes_choices:
        return interpreter_chosen(built, choices)
    program = built.program
    degree = exact_stacking(program.training.microbatches // world.size, program.stackable)
    chosen = interpreter_chosen(built, replace(choices, stacking=degree))
    if degree > 1:
        chosen.notes.append(f"stacking {degree}: a step's microbatches in one call, which changes no bit under "
                            ":arithmetic exact")
    return chosen


def interpreter_chosen(built, choices: Choices) -> Chosen:
    """The CPU interpreter's level: 1 on every machine; with exact sums, on any backend, the
    exact level, whose choices line is the backend's own (stacking and GPU count change no bit)."""
    if computes_exact(built):
        return Chosen(choices, How("exact"), described=built.backend_facts["choices"])
    return Chosen(choices, How("interpreter"))


_RECORDS_HINT = ("Give a checkpoint directory, an s3://…/step-<n> prefix, an experiment.json, a lowering "
                 "annotation, or fresh.")


def read_pinned(source: str) -> Choices:
    """The `choices` of a checkpoint (a step directory or s3://…/step-<n>), an experiment.json,
    or a lowering annotation's metadata."""
    if source.startswith("s3://") or os.path.isdir(source):
        return choices_from_json(read_record(source).get("choices"), source)
    if not os.path.lexists(source):
        raise SexpgpuError("E-CHOICE-004", f"--choices names {source}, which does not exist.", hint=_RECORDS_HINT)
    try:
        with open(source, encoding="utf-8") as handle:
            content = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise SexpgpuError("E-CHOICE-003", f"--choices {source}: cannot be read as JSON ({error}).",
                           hint=_RECORDS_HINT) from None
    if not isinstance(content, dict):
        content = {}
    metadata = content.get("metadata") if isinstance(content.get("metadata"), dict) else {}
    return choices_from_json(content.get("choices", metadata.get("choices")), source)


def stacked_training(program, degree: int):
    """The training graph the loop runs at this stacking degree."""
    return program.training if degree == 1 else stack_training(program.training, degree)


def lowering_annotation(report: str, chosen: Chosen) -> dict:
    """The run's lowering annotation: the report, with the device and the choices in its metadata."""
    return {"annotation": "lowering", "text": report,
            "metadata": {"device": chosen.choices.device, "choices": chosen.choices.to_json(),
                         "determinism": chosen.determinism()}}
