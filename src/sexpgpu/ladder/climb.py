"""`sexpgpu ladder` (docs/ladder.md): the tiers run on this machine and every promise of
docs/determinism.md checked on each, one row a promise (ladder/promises.py), written to
a report with plots (ladder/report.py); and `--envelopes`, the tiers' envelopes measured
again on this device (ladder/envelopes.py).

Everything a ladder reads is checked before its first run: the tiers named, the ladder
folder's manifest, each tier's file and its envelope, and the directory it writes."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

from sexpgpu.backends.select import cuda_problem
from sexpgpu.errors import SexpgpuError
from sexpgpu.ladder.envelopes import Envelope, outside_peers, read_envelope, regenerate, tier_digest
from sexpgpu.ladder.promises import FAIL, PROMISES, Outcome, Workspace
from sexpgpu.ladder.report import write_report
from sexpgpu.ladder.tiers import REFERENCE, read_tiers, select_tiers
from sexpgpu.run.rundir import default_run_dir, run_dir_errors
from sexpgpu.run.setup import build_run


@dataclass(frozen=True)
class LadderOptions:
    tiers: tuple = ()  # the tiers named; none: every tier of this device (the quick ones with `quick`)
    device: str = "auto"
    quick: bool = False
    run_dir: str | None = None  # where the report, plots and runs go (default: a new folder under runs/)
    folder: str = REFERENCE  # the ladder: tiers.json, the tiers' files, envelopes/
    out: object = None

    def command(self) -> str:
        words = ["sexpgpu ladder", *self.tiers, *(["--quick"] if self.quick else []), f"--device {self.device}"]
        return " ".join(words)


@dataclass
class TierResult:
    tier: object
    envelope: Envelope
    workspace: Workspace
    rows: list = field(default_factory=list)  # (Promise, Outcome)
    seconds: float = 0.0


@dataclass
class LadderResult:
    command: str
    device: str  # the backend's name, as the runs' reports give it
    directory: str
    tiers: list
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # of this process: on a machine with other work the wall time says less
    report: str = ""
    plots_note: str = ""  # why there are no plots, when there are none

    @property
    def failed(self) -> bool:
        return any(outcome.verdict == FAIL for result in self.tiers for _, outcome in result.rows)

    def counts(self) -> str:
        """How many rows passed, failed and were not run: "14 pass, 2 not run"."""
        verdicts = [outcome.verdict for result in self.tiers for _, outcome in result.rows]
        return ", ".join(f"{verdicts.count(verdict)} {verdict}" for verdict in dict.fromkeys(verdicts))


def device_kind(device: str) -> str:
    """cuda or cpu: what `--device` runs on here, as `sexpgpu run` picks it."""
    return "cuda" if device == "cuda" or (device == "auto" and cuda_problem() is None) else "cpu"


def run_ladder(options: LadderOptions) -> LadderResult:
    out = options.out or sys.stdout
    kind = device_kind(options.device)
    tiers = select_tiers(read_tiers(options.folder), options.tiers, kind, options.quick)
    prepared = [_prepared(tier, kind) for tier in tiers]
    directory = ladder_directory(options.run_dir)
    device = prepared[0][3] if prepared else kind
    result = LadderResult(options.command(), device, directory, [])
    started, cpu = time.perf_counter(), time.process_time()
    print(f"ladder: {len(tiers)} tiers on {device}, in {directory}", file=out, flush=True)
    for tier, experiment, envelope, _ in prepared:
        result.tiers.append(_climb(Workspace(tier, experiment, kind, os.path.join(directory, tier.name), envelope), out))
    result.seconds, result.cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    write_report(result)
    print(f"ladder: {result.counts()} in {result.seconds:.0f} s; report {result.report}", file=out, flush=True)
    return result


def _prepared(tier, kind: str) -> tuple:
    """(tier, its experiment, its envelope, the device's name), or the error that keeps the
    ladder from running."""
    built = build_run(tier.experiment(), kind, read_loads=False)
    if built.experiment.run.checkpoint is None or not built.experiment.run.passes:
        raise SexpgpuError("E-LADDER-001", f"the tier {tier.name} ({tier.file}) has no :checkpoint or no :passes: its "
                                           "resume and evaluate rows need both.",
                           hint="Checkpoint the tier in the middle of its steps and give it a pass.")
    return tier, built.experiment, read_envelope(tier, tier_digest(built)), built.backend_facts["name"]


def _climb(workspace: Workspace, out) -> TierResult:
    started = time.perf_counter()
    tier = workspace.tier
    result = TierResult(tier, workspace.envelope, workspace)
    for promise in PROMISES:
        outcome = _checked(promise, workspace)
        result.rows.append((promise, outcome))
        print(f"  {tier.name:<18}{promise.row:<18}{outcome.verdict:<9}{outcome.measured}", file=out, flush=True)
    result.seconds = time.perf_counter() - started
    return result


def _checked(promise, workspace) -> Outcome:
    """The row's outcome. A run that stops with a user-facing error (a pin this machine cannot
    take, say) breaks the promise: the row fails with the error, and the ladder goes on."""
    try:
        return promise.check(workspace)
    except SexpgpuError as error:
        return Outcome(FAIL, f"stopped: {error.render()}")


def ladder_directory(run_dir: str | None) -> str:
    """A new folder under runs/, or the one named, which must be new or empty (E-LADDER-005):
    a report beside another ladder's runs would say nothing true of either."""
    if run_dir is None:
        return default_run_dir("ladder")
    if os.path.exists(run_dir) and (not os.path.isdir(run_dir) or os.listdir(run_dir)):
        raise SexpgpuError("E-LADDER-005", f"--run-dir {run_dir} already holds files: a ladder writes its report and runs "
                                           "into a new or empty directory.",
                           hint="Name another directory, or leave out --run-dir for a new one under runs/.")
    with run_dir_errors(run_dir, "create"):
        os.makedirs(run_dir, exist_ok=True)
    return run_dir


def regenerate_envelopes(options: LadderOptions) -> list:
    """`sexpgpu ladder --envelopes`: each tier's envelope measured again on this device."""
    out = options.out or sys.stdout
    kind = device_kind(options.device)
    tiers = select_tiers(read_tiers(options.folder), options.tiers, kind, options.quick)
    envelopes = []
    for tier in tiers:
        started = time.perf_counter()
        envelope = regenerate(tier, kind, lambda line: print(line, file=out, flush=True))
        envelopes.append(envelope)
        print(f"{tier.name}: {len(envelope.sources)} sources from {'; '.join(envelope.devices())}; "
              f"{_peers_check(envelope)}; wrote {tier.envelope_file} in {time.perf_counter() - started:.0f} s",
              file=out, flush=True)
    return envelopes


def _peers_check(envelope: Envelope) -> str:
    outside = outside_peers(envelope)
    if outside:
        return f"outside the envelope of the others: {', '.join(outside)} (the margin is too narrow for this tier)"
    return "each source inside the envelope of the others"
