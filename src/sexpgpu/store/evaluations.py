"""A checkpoint's evaluations: what `sexpgpu evaluate` computed from it, kept beside it.

`<root>/evaluations/step-<n>.json` (a file, or an object under an S3 prefix) holds
`{"step": n, "evaluations": [entry, ...]}`, oldest first. It is written whole, atomically
(a temporary file renamed over it; one PUT on S3), and never inside the checkpoint itself:
the checkpoint's tensors, experiment.json and commit marker, and so its digests, stay as
the run wrote them.
"""

from __future__ import annotations

import json
import os

from sexpgpu.store.local_store import disk_errors
from sexpgpu.files import write_atomically
from sexpgpu.store.s3_objects import TransferSettings, get_bytes, put_object
from sexpgpu.store.uris import MissingFile, basename, is_s3, join, parent

FOLDER = "evaluations"


class UnreadableEvaluations(Exception):
    """An evaluations file that is not one; the caller says what to do."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


def evaluations_path(checkpoint: str) -> str:
    """Where the evaluations of the checkpoint at `checkpoint` (…/step-<n>) are kept."""
    return join(parent(checkpoint) if is_s3(checkpoint) else os.path.dirname(os.path.normpath(checkpoint)),
                FOLDER, basename(checkpoint) + ".json")


def read_evaluations(checkpoint: str) -> list:
    """The entries recorded for this checkpoint, oldest first; none when there is no file yet."""
    where = evaluations_path(checkpoint)
    try:
        data = _read(where)
    except MissingFile:
        return []
    try:
        content = json.loads(data)
        entries = content["evaluations"]
        if not isinstance(entries, list):
            raise TypeError("not a list")
    except (ValueError, KeyError, TypeError) as error:
        raise UnreadableEvaluations(where, f"not an evaluations file ({error})") from None
    return entries


def add_evaluation(checkpoint: str, step: int, entry: dict) -> str:
    """Append `entry` to the checkpoint's evaluations, atomically; returns the file's path."""
    entries = read_evaluations(checkpoint) + [entry]
    where = evaluations_path(checkpoint)
    text = json.dumps({"step": step, "evaluations": entries}, indent=2, sort_keys=True) + "\n"
    _write(where, text.encode("utf-8"))
    return where


def _read(where: str) -> bytes:
    if is_s3(where):
        return get_bytes(where, "read the evaluations")
    try:
        with open(where, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise MissingFile(where) from None
    except OSError as error:
        raise UnreadableEvaluations(where, f"cannot be read ({error.strerror or error})") from None


def _write(where: str, data: bytes) -> None:
    if is_s3(where):
        put_object(where, [data], len(data), "write the evaluations", TransferSettings.from_env())
        return
    with disk_errors(where, "write"):
        write_atomically(where, data)
