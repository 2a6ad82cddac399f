"""The ladder's rows (docs/ladder.md, "Rows"): each promise of docs/determinism.md, checked on
one tier. A row's runs are made through the run machinery itself (run/session.py,
tools/evaluating.py), in-process, in the tier's folder of the ladder's directory, each the
first time a row asks for it, so rows share them: the first run `a` serves five rows."""

from __future__ import annotations

import gc
import io
import os
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.run.choosing import FRESH, ChoiceSettings, choice_settings
from sexpgpu.tools.comparing import diff_runs, read_run
from sexpgpu.tools.evaluating import EvaluateOptions, evaluate, level_of
from sexpgpu.ladder.variations import compute, fixed_variation, offered_degrees
from sexpgpu.run.session import RunOptions, execute, run_flags
from sexpgpu.run.setup import build_run

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
# What an exact run may answer instead of computing: no PyTorch, or a backend that cannot sum
# exactly yet. The row then is not run, and says why; it does not fail.
EXACT_REFUSALS = ("E-EXACT-001", "E-EXACT-003")


@dataclass(frozen=True)
class Outcome:
    verdict: str  # PASS, FAIL or NOT_RUN
    measured: str


@dataclass(frozen=True)
class Recipe:
    """How one of a tier's runs is made: its choice settings and where it resumes from."""

    choices: Callable = lambda workspace: None  # -> the --choices value
    deterministic: bool = False
    resume: Callable = lambda workspace: None  # -> a checkpoint to resume from


def _middle(workspace) -> str:
    return os.path.join(workspace.run("a"), f"step-{workspace.middle}")


RUNS = {
    "a": Recipe(),
    "b": Recipe(),
    "pinned": Recipe(choices=lambda workspace: os.path.join(workspace.run("a"), "experiment.json")),
    "deterministic-1": Recipe(deterministic=True),
    "deterministic-2": Recipe(deterministic=True),
    "resumed": Recipe(resume=_middle),
    "rechosen": Recipe(choices=lambda workspace: FRESH, resume=_middle),
}


class Workspace:
    """One tier's runs in the ladder's directory. `made` maps a run's name to its directory,
    `computed` a device to its exact runs; a test may fill them in to check a row against
    runs of its own."""

    def __init__(self, tier, experiment, device: str, folder: str, envelope):
        self.tier, self.experiment, self.device, self.folder, self.envelope = tier, experiment, device, folder, envelope
        self.middle = experiment.run.checkpoint.every  # the tiers checkpoint in the middle and at the end
        self.made: dict = {}
        self.computed: dict = {}

    def run(self, name: str) -> str:
        if name not in self.made:
            self.made[name] = self._execute(name, RUNS[name])
        return self.made[name]

    def _execute(self, name: str, recipe: Recipe) -> str:
        folder = os.path.join(self.folder, name)
        base = choice_settings(None, False)  # the environment's, as `sexpgpu run` reads them
        settings = replace(base, choices=recipe.choices(self) or base.choices,
                           deterministic=recipe.deterministic or base.deterministic)
        sink = io.StringIO()  # the report and progress are in the run's directory (report.txt, metrics.jsonl)
        execute(self.experiment, RunOptions(run_dir=folder, device=self.device, resume=recipe.resume(self),
                                            flags=run_flags(self.device, settings), choices=settings, out=sink, err=sink))
        gc.collect()  # the run's backend and its device memory go before the next run's come
        return folder

    def exact(self, device: str):
        """{degree: Computed} of the tier under :arithmetic exact on `device`, at every degree
        it offers, or the refusal's message."""
        if device not in self.computed:
            self.computed[device] = self._exact_runs(device)
        return self.computed[device]

    def _exact_runs(self, device: str):
        run = self.experiment.run
        experiment = replace(self.experiment, runs={**self.experiment.runs, run.name: replace(run, arithmetic="exact")})
        try:
            degrees = offered_degrees(build_run(experiment, device))
            return {degree: compute(experiment, device, fixed_variation(degree), self.tier.exact_steps)
                    for degree in degrees}
        except SexpgpuError as error:
            if error.code not in EXACT_REFUSALS:
                raise
            return error.render()

    def loss_curve(self, *names: str) -> list:
        """The loss at each step of the runs named, a later run's steps over an earlier's: a
        resume's curve is its first run's steps before it and its own after."""
        steps = {}
        for name in names:
            steps.update(read_run(self.run(name)).steps)
        return [steps[step]["loss"] for step in sorted(steps)]


# --- comparing -----------------------------------------------------------------------------

def same_bits(first: str, second: str, resumed_at: int = 0) -> Outcome:
    """Whether two run directories hold the same bits (tools/comparing.py): every common step's
    loss bits and digest, the evaluations, the steps logged (the second may start after
    `resumed_at`) and the nearest common checkpoint's tensors."""
    diff = diff_runs(read_run(first), read_run(second))
    expected_gap = {"a": list(range(1, resumed_at + 1))} if resumed_at else {}
    if diff.first_step is None and diff.first_eval_step is None and diff.only_in == expected_gap and not diff.tensors:
        tensors = f", step-{diff.checkpoint_step}'s tensors" if diff.checkpoint_step is not None else ""
        return Outcome(PASS, f"identical: {diff.common_steps} steps' loss bits and digests, the evaluations{tensors}")
    return Outcome(FAIL, "differ: " + "; ".join(_differences(diff, expected_gap)))


def _differences(diff, expected_gap: dict) -> list:
    found = []
    if diff.first_step is not None:
        found.append(f"step {diff.first_step}'s {' and '.join(diff.first_step_parts)}")
    if diff.first_eval_step is not None:
        found.append(f"step {diff.first_eval_step}'s {', '.join(diff.first_eval_keys)}")
    if diff.only_in != expected_gap:
        found.append("the steps logged (" + ", ".join(f"{len(steps)} only in {name}" for name, steps in diff.only_in.items())
                     + ")")
    if diff.tensors:
        largest = max(diff.tensors, key=lambda tensor: tensor.max_rel)
        count = f"{len(diff.tensors)} tensor" + ("s" if len(diff.tensors) > 1 else "")
        found.append(f"{count} of step-{diff.checkpoint_step} (largest relative difference "
                     f"{largest.max_rel:.3g}, in {largest.name})")
    return found


def same_computed(computed: dict) -> tuple:
    """(the degrees whose steps or final tensors differ from the first's, what they agree in)."""
    first, *others = computed
    reference = computed[first]
    differing = [degree for degree in others
                 if computed[degree].records != reference.records or not _same_tensors(computed[degree].state, reference.state)]
    steps = f"{len(reference.records)} steps'" if len(reference.records) > 1 else "1 step's"
    return differing, f"{steps} loss bits, gradient norms and digests and the final {len(reference.state)} tensors"


def _same_tensors(left: dict, right: dict) -> bool:
    return left.keys() == right.keys() and all(np.asarray(left[name]).tobytes() == np.asarray(right[name]).tobytes()
                                               for name in left)


# --- the rows ------------------------------------------------------------------------------

def _same_bits_of(first: str, second: str, resumed: bool = False) -> Callable:
    """The row that checks two of the tier's runs for the same bits (after the middle step, if `resumed`)."""
    return lambda workspace: same_bits(workspace.run(first), workspace.run(second),
                                       resumed_at=workspace.middle if resumed else 0)


def _level_3(workspace) -> Outcome:
    containment = workspace.envelope.check(workspace.loss_curve("a", "rechosen"))
    level = level_of(_determinism(workspace, "rechosen"))
    return Outcome(PASS if containment.inside else FAIL, f"{containment.describe()} (the resume states level {level})")


def _determinism(workspace, name: str) -> str:
    """The determinism line of a run's report."""
    with open(os.path.join(workspace.run(name), "report.txt"), encoding="utf-8") as handle:
        lines = [line.strip() for line in handle if line.strip().startswith("determinism")]
    return lines[-1].removeprefix("determinism").strip()


def _evaluate(workspace) -> Outcome:
    first = workspace.run("a")
    inline = read_run(first).evaluations
    evaluations = evaluate([first], EvaluateOptions(device=workspace.device, choices=ChoiceSettings(), out=io.StringIO()))
    differing = [f"step {found.step}" for found in evaluations for values in found.values
                 if any(inline.get(found.step, {}).get(key) != value for key, value in values.items())]
    steps = ", ".join(str(found.step) for found in evaluations)
    levels = ", ".join(dict.fromkeys(level_of(found.determinism) for found in evaluations))
    if not evaluations or differing:
        return Outcome(FAIL, f"offline values differ from the inline ones at {', '.join(differing) or 'no checkpoint'}")
    return Outcome(PASS, f"offline equals inline bit for bit at steps {steps} (determinism {levels})")


def _exact_stacking(workspace) -> Outcome:
    computed = workspace.exact(workspace.device)
    if isinstance(computed, str):
        return Outcome(NOT_RUN, computed)
    degrees = ", ".join(str(degree) for degree in computed)
    if len(computed) < 2:
        return Outcome(NOT_RUN, f"this device offers the tier stacking {degrees} only")
    differing, agreed = same_computed(computed)
    if differing:
        return Outcome(FAIL, f"stacking {', '.join(map(str, differing))} differ from stacking 1 in {agreed}")
    return Outcome(PASS, f"stacking {degrees}: identical {agreed}")


def _exact_devices(workspace) -> Outcome:
    if workspace.device == "cpu":
        return Outcome(NOT_RUN, "no GPU in this ladder (--device cuda runs it)")
    if "cpu" not in workspace.tier.devices:
        return Outcome(NOT_RUN, "the tier is too large for the CPU interpreter")
    runs = {}
    for device in (workspace.device, "cpu"):  # the GPU's first: it may refuse, and the CPU's then is not needed
        runs[device] = workspace.exact(device)
        if isinstance(runs[device], str):
            return Outcome(NOT_RUN, runs[device])
    differing, agreed = same_computed({device: runs[device][1] for device in ("cpu", workspace.device)})
    if differing:
        return Outcome(FAIL, f"the GPU's stacking 1 differs from the CPU's in {agreed}")
    return Outcome(PASS, f"stacking 1 on the CPU and on the GPU: identical {agreed}")


@dataclass(frozen=True)
class Promise:
    row: str
    promised: str
    check: Callable[[Workspace], Outcome]


PROMISES = (
    Promise("level 1", "the same run twice: identical bits", _same_bits_of("a", "b")),
    Promise("level 2", "a run pinned to the first run's recorded choices (--choices its experiment.json): its bits",
            _same_bits_of("a", "pinned")),
    Promise("level 3", "the first run resumed from its middle checkpoint choosing again (--choices fresh): every step's "
                       "loss inside the envelope", _level_3),
    Promise("--deterministic", "twice under --deterministic: identical bits", _same_bits_of("deterministic-1", "deterministic-2")),
    Promise("resume", "the first run resumed from its middle checkpoint: its bits",
            _same_bits_of("a", "resumed", resumed=True)),
    Promise("evaluate", "sexpgpu evaluate of each checkpoint: the eval values the run logged inline", _evaluate),
    Promise("exact: stacking", ":arithmetic exact at every stacking degree: identical bits", _exact_stacking),
    Promise("exact: CPU = GPU", ":arithmetic exact on the CPU and on the GPU: identical bits", _exact_devices),
)
