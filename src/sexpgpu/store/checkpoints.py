"""Writing, finding and reading checkpoints, on a local disk or on S3.

A checkpoint is a directory or S3 prefix `<root>/step-<n>/` holding:

- `model.safetensors`: every tensor named `param/<path>`, stored under `<path>`;
- `optimizer.safetensors`: every other tensor (optimizer state), under its full name;
- `experiment.json`: the caller's record plus `format`, `step` and `tensors`, the SHA-256 and
  byte count of each tensor file;
- `COMMITTED`: written last; it holds the SHA-256 of experiment.json. Without it the
  directory or prefix is not a checkpoint.

See docs/checkpoints.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.store import crash_points, safetensors_io
from sexpgpu.store import local_store
from sexpgpu.store import s3_store
from sexpgpu.store.checks import (EXPERIMENT_FILE, FORMAT, MARKER, MODEL_FILE, OPTIMIZER_FILE, TensorSpec, check_marker,
                                  check_name, check_record, check_tensor_set, corrupt, parse_json)
from sexpgpu.store.digests import BackgroundSha256, chunks
from sexpgpu.store.loads import LoadPin
from sexpgpu.store.uris import MissingFile, is_s3, join, parent

PARAM_PREFIX = "param/"
RESERVED_KEYS = ("format", "step", "tensors")


@dataclass
class Checkpoint:
    step: int
    tensors: dict[str, np.ndarray]
    experiment: dict
    path: str
    stored_dtypes: dict[str, str] = field(default_factory=dict)  # e.g. {"param/w": "BF16"}


def _steps_module(path: str):
    return s3_store if is_s3(path) else local_store


def write_checkpoint(dest_root: str, step: int, tensors: dict[str, np.ndarray], experiment: dict,
                     keep: int | None = None, bf16=(), note: Callable[[str], None] | None = None) -> str:
    """Write `<dest_root>/step-<step>/` atomically and return its path.

    `bf16` names float32 tensors that hold bf16 values (low 16 bits zero); they are stored
    as BF16. With `keep=K`, once this checkpoint is committed, older ones beyond the K newest
    (this one included) are deleted. A committed checkpoint at this step has its files
    verified against their recorded digests first: if they verify and hold the same tensor
    bytes it is kept and its path returned; if they verify and hold others, E-CKPT-004; if
    it is damaged it is replaced, atomically, and `note` is told.
    """
    _check_arguments(step, experiment, keep)
    steps = _steps_module(dest_root)
    files = _encode_files(tensors, bf16)
    existing = steps.committed_steps(dest_root).get(step)
    damage = _damage(existing) if existing is not None else None
    if existing is not None and damage is None:
        path = _same_or_refuse(existing, files)
    else:
        path = _write_new(steps.Writer(dest_root, step, replacing=existing is not None), step, files, experiment)
        if damage is not None and note is not None:
            note(f"{damage.message.rstrip('.')}; it was replaced by this run's step {step}, written anew")
    if keep is not None:
        _retain(steps, dest_root, step, keep)
    steps.remove_partials(dest_root, step)
    return path


def _write_new(writer, step: int, files: dict[str, safetensors_io.Encoded], experiment: dict) -> str:
    """Tensor files, then experiment.json with their digests, then the commit."""
    try:
        digests = {name: {"sha256": writer.write(name, enc.buffers, enc.nbytes), "bytes": enc.nbytes}
                   for name, enc in files.items()}
        text = _experiment_text(experiment, step, digests)
        sha = writer.write(EXPERIMENT_FILE, [text], len(text))
        marker = json.dumps({"format": FORMAT, "step": step, EXPERIMENT_FILE: {"sha256": sha, "bytes": len(text)}},
                            sort_keys=True).encode() + b"\n"
        path = writer.commit(marker)
    except BaseException as error:
        writer.abort(error)
        raise
    crash_points.reached("committed")
    return path


def _check_arguments(step, experiment, keep) -> None:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative integer, not {step!r}")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep must be a positive integer or None, not {keep!r}")
    clash = [key for key in RESERVED_KEYS if key in experiment and not (key == "step" and experiment[key] == step)]
    if clash:
        raise ValueError(f"the experiment record may not set {clash}: the checkpoint writes them")
    json.dumps(experiment, allow_nan=False)  # fail before writing anything, not after the tensors


def _encode_files(tensors, bf16) -> dict[str, safetensors_io.Encoded]:
    bf16 = set(bf16)
    model = {name[len(PARAM_PREFIX):]: array for name, array in tensors.items() if name.startswith(PARAM_PREFIX)}
    optimizer = {name: array for name, array in tensors.items() if not name.startswith(PARAM_PREFIX)}
    model_bf16 = [name[len(PARAM_PREFIX):] for name in bf16 if name.startswith(PARAM_PREFIX)]
    files = {MODEL_FILE: safetensors_io.encode(model, model_bf16)}
    if optimizer:
        files[OPTIMIZER_FILE] = safetensors_io.encode(optimizer, [name for name in bf16 if not name.startswith(PARAM_PREFIX)])
    return files


def _experiment_text(experiment: dict, step: int, digests: dict) -> bytes:
    record = {**experiment, "format": FORMAT, "step": step, "tensors": digests}
    return json.dumps(record, indent=2, sort_keys=True, allow_nan=False).encode() + b"\n"


def _damage(path: str) -> SexpgpuError | None:
    """The E-CKPT-001 that a committed checkpoint's files on disk give against their recorded
    digests, or None when every file verifies."""
    try:
        for _ in _verified_files(path, read_record(path)):
            pass
    except SexpgpuError as error:
        if error.code != "E-CKPT-001":
            raise
        return error
    return None


def _same_or_refuse(existing: str, files: dict[str, safetensors_io.Encoded]) -> str:
    """A verified checkpoint is kept when its tensor files are ours, byte for byte."""
    ours = {name: {"sha256": _digest(enc), "bytes": enc.nbytes} for name, enc in files.items()}
    if read_record(existing)["tensors"] == ours:
        return existing
    raise SexpgpuError("E-CKPT-004", f"a different checkpoint is already committed at {existing}; it was left as it is.",
                       hint="Resume from it, or write this run's checkpoints somewhere else.")


def _digest(encoded: safetensors_io.Encoded) -> str:
    with BackgroundSha256() as digest:
        for piece in chunks(encoded.buffers):
            digest.update(piece)
        return digest.hexdigest()


def _retain(steps, root: str, new_step: int, keep: int) -> None:
    """Keep `new_step` and the keep-1 newest committed steps below it; never touch later steps."""
    committed = steps.committed_steps(root)
    older = [s for s in committed if s < new_step]
    for step in older[: max(0, len(older) - (keep - 1))]:
        steps.remove_step(committed[step])


def list_checkpoints(run_root: str) -> list[tuple[int, str]]:
    """[(step, path)] of every committed checkpoint under `run_root`, oldest first."""
    return list(_steps_module(run_root).committed_steps(run_root).items())


def resolve_checkpoint(spec: str, run_root: str) -> str:
    """The checkpoint `spec` names: a path or s3:// URI of a `step-<n>`, or `latest`.

    `latest` is the newest committed checkpoint under `run_root`. Anything that is not a
    committed checkpoint is E-CKPT-003, naming the steps that do exist.
    """
    if spec == "latest":
        found = list_checkpoints(run_root)
        if not found:
            begun = list(_steps_module(run_root).uncommitted_steps(run_root).values())
            unfinished = f" ({', '.join(begun)} {'was' if len(begun) == 1 else 'were'} begun and never committed)" if begun else ""
            raise SexpgpuError("E-CKPT-003", f"there is no committed checkpoint under {run_root} to resume from{unfinished}.",
                               hint="Start the run without --resume, or name the directory that holds its checkpoints.")
        return found[-1][1]
    # A bare step-<n> means the one under the run's root: a missing one is named there.
    candidates = [join(run_root, spec), spec] if local_store.STEP_NAME.fullmatch(spec) else [spec]
    for candidate in candidates:
        if _steps_module(candidate).is_committed(candidate):
            return candidate
    raise _missing_step(candidates[0])


def _missing_step(spec: str) -> SexpgpuError:
    inside = list_checkpoints(spec)
    if inside:
        return SexpgpuError("E-CKPT-003", f"{spec} holds checkpoints, not one: name a step, such as "
                            f"{inside[-1][1]}, or use latest.")
    beside = [step for step, _ in list_checkpoints(parent(spec))]
    where = f"{parent(spec)} has committed steps {beside}" if beside else f"{parent(spec)} has no committed checkpoint"
    return SexpgpuError("E-CKPT-003", f"there is no committed checkpoint at {spec}; {where}.",
                        hint="A step-<n> without a COMMITTED marker was interrupted while being written.")


def read_checkpoint(path: str) -> Checkpoint:
    """Read and verify a committed checkpoint: every file must match its recorded digest."""
    record = read_record(path)
    tensors, dtypes = {}, {}
    for name, data in _verified_files(path, record):
        header = _parse(path, name, data, len(data))
        prefix = PARAM_PREFIX if name == MODEL_FILE else ""
        for key, array in safetensors_io.decode_all(header, data).items():
            tensors[prefix + key] = array
            dtypes[prefix + key] = header.entries[key].dtype
    return Checkpoint(record["step"], dict(sorted(tensors.items())), record, path, dtypes)


def _verified_files(path: str, record: dict):
    """(name, bytes) of each tensor file the record names, once it matches its recorded byte
    count and SHA-256 (E-CKPT-001 if not)."""
    for name, expected in sorted(record["tensors"].items()):
        yield name, _verified(path, name, expected)


def _verified(path: str, name: str, expected: dict):
    """The bytes of one of the checkpoint's files, once they match `expected`'s byte count and SHA-256."""
    try:
        data, sha = _steps_module(path).read_whole(join(path, name))
    except MissingFile:
        raise corrupt(path, f"{name} is missing") from None
    if len(data) != expected["bytes"]:
        raise corrupt(path, f"{name} has {len(data)} bytes where {expected['bytes']} were written (truncated?)")
    if sha != expected["sha256"]:
        raise corrupt(path, f"{name} has SHA-256 {sha} where {expected['sha256']} was written")
    return data


def read_record(path: str) -> dict:
    """A committed checkpoint's experiment.json, verified against its commit marker, every
    field of both checked, and the step in the directory's name checked against it."""
    steps = _steps_module(path)
    if not steps.is_committed(path):
        raise _missing_step(path)
    try:
        marker = parse_json(path, MARKER, steps.read_small(join(path, MARKER)))
    except MissingFile:
        raise corrupt(path, f"its {MARKER} marker is missing") from None
    data = _verified(path, EXPERIMENT_FILE, check_marker(path, marker))
    record = check_record(path, parse_json(path, EXPERIMENT_FILE, data), marker)
    check_name(path, record["step"])
    return record


def recorded_pins(path: str, record: dict) -> list[LoadPin]:
    """The record's `loads`, each checked for its fields and types (E-CKPT-001 if not)."""
    loads = record.get("loads", [])
    if not isinstance(loads, list):
        raise corrupt(path, f"{EXPERIMENT_FILE}'s loads is not a list")
    try:
        return [LoadPin.from_json(pin) for pin in loads]
    except ValueError as error:
        raise corrupt(path, f"{EXPERIMENT_FILE}'s loads: {error}") from None


def check_tensors(checkpoint: Checkpoint, expected: dict[str, TensorSpec]) -> None:
    """E-CKPT-006 unless the checkpoint holds exactly the `expected` tensors, by name, shape and stored dtype."""
    found = {name: TensorSpec(tuple(array.shape), checkpoint.stored_dtypes[name])
             for name, array in checkpoint.tensors.items()}
    check_tensor_set(checkpoint.path, found, expected)


@dataclass
class Verified:
    """What `checkpoint --verify` checked: each tensor file's bytes and tensor count."""

    path: str
    step: int
    files: dict[str, dict]  # {file: {"bytes": n, "tensors": count}}


def verify_checkpoint(path: str) -> Verified:
    """Hash every file of a checkpoint against its recorded SHA-256, decode every tensor and
    check the load pins; the first mismatch is E-CKPT-001 naming the file."""
    checkpoint = read_checkpoint(path)
    recorded_pins(path, checkpoint.experiment)
    files = {name: {"bytes": entry["bytes"], "tensors": 0} for name, entry in sorted(checkpoint.experiment["tensors"].items())}
    for name in checkpoint.tensors:
        files[MODEL_FILE if name.startswith(PARAM_PREFIX) else OPTIMIZER_FILE]["tensors"] += 1
    return Verified(path, checkpoint.step, files)


def format_verified(verified: Verified) -> str:
    files = ", ".join(f"{name} ({entry['bytes']} bytes, {entry['tensors']} tensors)" for name, entry in verified.files.items())
    return f"OK  {verified.path}: step {verified.step}; {files} match their SHA-256"


def uncommitted_after(path: str, step: int) -> dict[int, str]:
    """{step: where} of the steps after `step` beside the checkpoint `path` that were never
    committed: interrupted writes that a resume from `path` should name."""
    root = parent(path)
    return {later: where for later, where in _steps_module(root).uncommitted_steps(root).items() if later > step}


def _parse(path: str, name: str, head, file_bytes: int) -> safetensors_io.Header:
    try:
        return safetensors_io.parse_header(head, file_bytes)
    except safetensors_io.SafetensorsFormatError as error:
        raise corrupt(path, f"{name} is not a valid safetensors file: {error}") from None


def tensor_headers(path: str, record: dict) -> dict[str, safetensors_io.Header]:
    """{file: header} of a checkpoint's tensor files, reading only their headers."""
    steps = _steps_module(path)
    headers = {}
    for name in sorted(record["tensors"]):
        file = join(path, name)
        try:
            prefix, _ = steps.read_head(file, 8)
            length = int.from_bytes(prefix[:8], "little") if len(prefix) == 8 else 0
            head, size = steps.read_head(file, 8 + min(length, safetensors_io.MAX_HEADER_BYTES))
        except MissingFile:
            raise corrupt(path, f"{name} is missing") from None
        headers[name] = _parse(path, name, head, size)
    return headers

