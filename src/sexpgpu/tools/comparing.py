"""What two finished runs hold, side by side: `sexpgpu diff` (docs/tools.md).

A run is read from its directory (metrics.jsonl, experiment.json, its checkpoints) or from a
metrics file alone. Two runs are the same when every common step's loss bits and parameter
digest agree, every common evaluation's values agree bit for bit, they ran the same steps,
and the nearest checkpoint both hold agrees bit for bit. Where they part, the diff names
the first step, the parameters that differ in the checkpoints nearest that step and by
how much; the records' entries that differ (experiment, flags, settings, choices) say why.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.run.report import row
from sexpgpu.store import list_checkpoints, read_checkpoint

METRICS = "metrics.jsonl"
RECORD = "experiment.json"
RECORD_KEYS = ("experiment", "flags", "choices", "data", "loads")  # what a run directory's record holds
SHOWN_WIDTH = 48
TABLE_ROWS = 12  # tensors and record entries the table shows; --json lists them all


@dataclass(frozen=True)
class RunRecords:
    source: str  # as the user named it
    steps: dict  # step -> the training step's metrics record (it has a digest)
    evaluations: dict  # step -> the step's evaluation records merged
    record: dict  # the run directory's experiment.json, or {} for a metrics file alone
    checkpoints: dict  # step -> path of each committed checkpoint found


def read_run(path: str) -> RunRecords:
    """A run directory, or a metrics.jsonl (its directory's record and checkpoints, if any)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        folder, metrics = path, os.path.join(path, METRICS)
    elif os.path.isfile(path):
        folder, metrics = os.path.dirname(os.path.abspath(path)), path
    else:
        raise SexpgpuError("E-DIFF-001", f"{path} is neither a run directory nor a metrics file.",
                           hint="Name a directory that `sexpgpu run --run-dir` wrote, or its metrics.jsonl.")
    if not os.path.isfile(metrics):
        raise SexpgpuError("E-DIFF-001", f"{path} holds no {METRICS}: it is not a run directory.",
                           hint="Name a directory that `sexpgpu run --run-dir` wrote, or its metrics.jsonl.")
    steps, evaluations = read_metrics(metrics)
    record = _read_record(os.path.join(folder, RECORD))
    return RunRecords(path, steps, evaluations, record, _checkpoints(folder, record))


def read_metrics(path: str) -> tuple:
    """({step: training record}, {step: evaluation records merged}). A last line without its
    newline, torn by a crash, is left out, as a resume leaves it out."""
    steps, evaluations = {}, {}
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):  # the part after the last newline is torn or empty
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise SexpgpuError("E-DIFF-002", f"{path}:{number}: not a metrics record (a JSON object with a step).",
                               hint="Give a metrics.jsonl that sexpgpu run wrote.")
        if "digest" in record:
            steps[record["step"]] = record
        else:
            evaluations.setdefault(record["step"], {}).update(record)
    return steps, evaluations


def _read_record(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        raise SexpgpuError("E-DIFF-002", f"{path} cannot be read as a run's record ({error}).",
                           hint="Give a run directory that sexpgpu run wrote.") from None
    return record if isinstance(record, dict) else {}


def _checkpoints(folder: str, record: dict) -> dict:
    """The run directory's checkpoints, else those where its record says they went
    (--checkpoint-to), else those under the file's :to."""
    found = dict(list_checkpoints(folder))
    run = record.get("experiment", {}).get("run", {}) if isinstance(record.get("experiment"), dict) else {}
    for elsewhere in (record.get("checkpoints"), (run.get("checkpoint") or {}).get("to")):
        if not found and isinstance(elsewhere, str):
            found = dict(list_checkpoints(elsewhere))
    return found


# --- the comparison -----------------------------------------------------------------------

@dataclass(frozen=True)
class TensorDifference:
    name: str
    max_abs: float
    max_rel: float
    differing: int
    count: int
    note: str = ""  # a tensor only one holds, or of another shape


@dataclass
class Diff:
    a: str
    b: str
    common_steps: int
    first_step: int | None = None  # the first common step whose loss bits or digest differ
    first_step_parts: list = field(default_factory=list)  # "loss bits", "digest"
    first_eval_step: int | None = None
    first_eval_keys: list = field(default_factory=list)
    only_in: dict = field(default_factory=dict)  # "a"/"b" -> steps the other lacks
    checkpoint_step: int | None = None
    tensors: list = field(default_factory=list)  # TensorDifference
    records: list = field(default_factory=list)  # [key, a's value, b's value]

    @property
    def identical(self) -> bool:
        """The same bits: the records' differences explain, and do not make runs differ by
        themselves (a run pinned to another's choices that repeats its bits is identical)."""
        return self.first_step is None and self.first_eval_step is None and not self.only_in and not self.tensors

    def to_json(self) -> dict:
        return dict(asdict(self), identical=self.identical)


def diff_runs(a: RunRecords, b: RunRecords) -> Diff:
    common = sorted(set(a.steps) & set(b.steps))
    diff = Diff(a.source, b.source, len(common))
    for step in common:
        parts = [name for name, key in (("loss bits", "loss_bits"), ("digest", "digest"))
                 if a.steps[step].get(key) != b.steps[step].get(key)]
        if parts:
            diff.first_step, diff.first_step_parts = step, parts
            break
    for step in sorted(set(a.evaluations) & set(b.evaluations)):
        # values both runs logged: diag/* of a diagnosed run is not a difference from an undiagnosed one
        keys = sorted(key for key in set(a.evaluations[step]) & set(b.evaluations[step])
                      if a.evaluations[step][key] != b.evaluations[step][key])
        if keys:
            diff.first_eval_step, diff.first_eval_keys = step, keys
            break
    diff.only_in = {name: steps for name, steps in (("a", sorted(set(a.steps) - set(b.steps))),
                                                    ("b", sorted(set(b.steps) - set(a.steps)))) if steps}
    diff.checkpoint_step = nearest_common(a.checkpoints, b.checkpoints, diff.first_step or diff.first_eval_step)
    if diff.checkpoint_step is not None:
        diff.tensors = compare_tensors(read_checkpoint(a.checkpoints[diff.checkpoint_step]).tensors,
                                       read_checkpoint(b.checkpoints[diff.checkpoint_step]).tensors)
    diff.records = record_differences(a.record, b.record)
    return diff


def nearest_common(a: dict, b: dict, step: int | None) -> int | None:
    """The step of both runs' checkpoints nearest `step` (the earlier on a tie), or the last
    one both hold when the metrics agree."""
    both = sorted(set(a) & set(b))
    if not both:
        return None
    if step is None:
        return both[-1]
    return min(both, key=lambda candidate: (abs(candidate - step), candidate))


def compare_tensors(a: dict, b: dict) -> list:
    """A TensorDifference for each tensor whose bits differ, in name order."""
    found = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            found.append(TensorDifference(name, 0.0, 0.0, 0, 0, f"only in {'a' if name in a else 'b'}"))
            continue
        left, right = np.asarray(a[name], dtype=np.float32), np.asarray(b[name], dtype=np.float32)
        if left.shape != right.shape:
            found.append(TensorDifference(name, 0.0, 0.0, 0, 0, f"shapes {left.shape} and {right.shape}"))
            continue
        differing = left.view(np.uint32) != right.view(np.uint32)
        count = int(differing.sum())
        if count:
            found.append(_sized(name, left[differing].astype(np.float64), right[differing].astype(np.float64),
                                count, left.size))
    return found


def _sized(name: str, left: np.ndarray, right: np.ndarray, differing: int, count: int) -> TensorDifference:
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = np.abs(left - right)
        scale = np.maximum(np.abs(left), np.abs(right))
        relative = np.where(scale > 0, gap / np.where(scale > 0, scale, 1), 0.0)
    return TensorDifference(name, float(np.nanmax(gap)) if np.isfinite(gap).any() else float("nan"),
                            float(np.nanmax(relative)) if np.isfinite(relative).any() else float("nan"),
                            differing, count)


def record_differences(a: dict, b: dict) -> list:
    """[dotted key, a's value, b's value] of each entry of the records that differs."""
    left, right = _flat({key: a.get(key) for key in RECORD_KEYS if a}), _flat({key: b.get(key) for key in RECORD_KEYS if b})
    return [[key, left.get(key), right.get(key)] for key in sorted(set(left) | set(right))
            if left.get(key) != right.get(key)]


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and value:
        flat = {}
        for key, inner in value.items():
            flat.update(_flat(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value} if prefix else {}


# --- the table ----------------------------------------------------------------------------

def format_diff(diff: Diff) -> str:
    rows = [f"diff {diff.a} {diff.b}", row("steps in common", str(diff.common_steps))]
    for name, steps in diff.only_in.items():
        rows.append(row(f"only in {name}", f"steps {steps[0]}..{steps[-1]} ({len(steps)})"))
    rows.append(row("first difference", f"step {diff.first_step}: {' and '.join(diff.first_step_parts)}"
                     if diff.first_step is not None else "none: every common step's loss bits and digest agree"))
    rows.append(row("evaluations", f"step {diff.first_eval_step}: {', '.join(diff.first_eval_keys)}"
                     if diff.first_eval_step is not None else "agree"))
    if diff.checkpoint_step is None:
        rows.append(row("checkpoints", "none at a step both runs hold"))
    else:
        rows.append(row("checkpoints", f"step {diff.checkpoint_step}: "
                         + (f"{len(diff.tensors)} tensors differ" if diff.tensors else "every tensor's bits agree")))
        if diff.tensors:
            rows.append(f"    {'tensor':<32}{'max abs':>12}{'max rel':>12}  differing")
            rows += _capped([f"    {t.name:<32}{t.note}" if t.note else
                             f"    {t.name:<32}{t.max_abs:>12.3g}{t.max_rel:>12.3g}  {t.differing} of {t.count}"
                             for t in diff.tensors])
    rows.append(row("records", f"{len(diff.records)} entries differ" if diff.records else "agree"))
    rows += _capped([f"    {key:<44}{_shown(left)}  vs  {_shown(right)}" for key, left, right in diff.records])
    rows.append(row("verdict", "identical (exit 0)" if diff.identical else "different (exit 1)"))
    return "\n".join(rows)


def _capped(rows: list) -> list:
    if len(rows) <= TABLE_ROWS:
        return rows
    return rows[:TABLE_ROWS] + [f"    … and {len(rows) - TABLE_ROWS} more (--json lists them all)"]


def _shown(value) -> str:
    text = "(absent)" if value is None else json.dumps(value, sort_keys=True)
    return text if len(text) <= SHOWN_WIDTH else text[:SHOWN_WIDTH - 1] + "…"
