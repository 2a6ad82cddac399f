"""What a checkpoint's commit marker, record, name and tensors must be before anything trusts them.

Every field is checked for its type and range before it is used, so a damaged checkpoint is a
coded error that says what is wrong, never an exception from deep inside a reader:
E-CKPT-001 for a damaged marker or record, E-CKPT-005 for a directory whose name and record
disagree on the step, E-CKPT-006 for tensors that do not fit the model resuming from them.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from sexpgpu.errors import SexpgpuError

FORMAT = "sexpgpu-checkpoint/1"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
EXPERIMENT_FILE = "experiment.json"
MARKER = "COMMITTED"
TENSOR_FILES = (MODEL_FILE, OPTIMIZER_FILE)
MARKER_KEYS = {"format", "step", EXPERIMENT_FILE}
STEP_NAME = re.compile(r"step-(0|[1-9][0-9]*)")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHOWN = 12


class TensorSpec(NamedTuple):
    """What a model expects of one checkpoint tensor: its shape and stored dtype ("F32", "BF16")."""

    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype} {list(self.shape)}"


def corrupt(path: str, what: str) -> SexpgpuError:
    return SexpgpuError("E-CKPT-001", f"the checkpoint {path} is damaged: {what}.",
                        hint="Resume from an earlier checkpoint; this one was left as it is.")


def parse_json(path: str, name: str, data) -> object:
    """A marker's or record's JSON; unreadable bytes or nesting too deep are E-CKPT-001."""
    try:
        return json.loads(bytes(data))
    except (ValueError, RecursionError):
        raise corrupt(path, f"{name} is not JSON") from None


def is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _digest_problem(entry) -> str | None:
    """Why `entry` is not {"sha256": 64 hex digits, "bytes": a count}, or None."""
    if not isinstance(entry, dict) or set(entry) != {"sha256", "bytes"}:
        return 'is not {"sha256": ..., "bytes": ...}'
    if not isinstance(entry["sha256"], str) or not _SHA256.fullmatch(entry["sha256"]):
        return "has a sha256 that is not 64 lowercase hex digits"
    if not is_count(entry["bytes"]):
        return "has a byte count that is not a non-negative integer"
    return None


def check_marker(path: str, marker) -> dict:
    """The marker's digest entry for experiment.json, after checking every field."""
    if not isinstance(marker, dict) or set(marker) != MARKER_KEYS:
        raise corrupt(path, f"its {MARKER} marker does not hold exactly the keys {sorted(MARKER_KEYS)}")
    if marker["format"] != FORMAT:
        raise corrupt(path, f"its {MARKER} marker is for format {_short(marker['format'])}, not {FORMAT}")
    if not is_count(marker["step"]):
        raise corrupt(path, f"its {MARKER} marker's step {_short(marker['step'])} is not a non-negative integer")
    problem = _digest_problem(marker[EXPERIMENT_FILE])
    if problem:
        raise corrupt(path, f"its {MARKER} marker's entry for {EXPERIMENT_FILE} {problem}")
    return marker[EXPERIMENT_FILE]


def check_record(path: str, record, marker: dict) -> dict:
    """experiment.json's own fields: format, step (the marker's) and a digest for each tensor file."""
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise corrupt(path, f"{EXPERIMENT_FILE} is not in the {FORMAT} format")
    if record.get("step") != marker["step"] or not is_count(record.get("step")):
        raise corrupt(path, f"{EXPERIMENT_FILE} is for step {_short(record.get('step'))} but {MARKER} for {marker['step']}")
    tensors = record.get("tensors")
    if not isinstance(tensors, dict) or MODEL_FILE not in tensors or not set(tensors) <= set(TENSOR_FILES):
        raise corrupt(path, f"{EXPERIMENT_FILE}'s tensors name {_short(tensors)}, not {MODEL_FILE} "
                            f"and perhaps {OPTIMIZER_FILE}")
    for name, entry in tensors.items():
        problem = _digest_problem(entry)
        if problem:
            raise corrupt(path, f"{EXPERIMENT_FILE}'s entry for {name} {problem}")
    return record


def check_name(path: str, step: int) -> None:
    """A directory named step-<n> must hold step n; a copy under another kind of name may hold any."""
    name = path.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]
    match = STEP_NAME.fullmatch(name)
    if match and int(match.group(1)) != step:
        raise SexpgpuError(
            "E-CKPT-005", f"the checkpoint {path} is named for step {match.group(1)}, but its record is for step {step}.",
            hint="A renamed or copied directory? Give it the name step-<its step>, or name it something that "
                 "is not step-<n>; it was left as it is.")


def check_tensor_set(path: str, found: dict[str, TensorSpec], expected: dict[str, TensorSpec]) -> None:
    """E-CKPT-006 naming every missing, extra and mismatched tensor, unless `found` is `expected`."""
    problems = [f"missing {name} ({expected[name]})" for name in sorted(set(expected) - set(found))]
    problems += [f"extra {name} ({found[name]})" for name in sorted(set(found) - set(expected))]
    problems += [f"{name} is {found[name]} where the model has {expected[name]}"
                 for name in sorted(set(found) & set(expected)) if found[name] != expected[name]]
    if problems:
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise SexpgpuError(
            "E-CKPT-006", f"the checkpoint {path} does not hold this model's tensors: {'; '.join(problems[:_SHOWN])}{more}.",
            hint="Resume with the model that wrote it; nothing was trained.")


def _short(value) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."
