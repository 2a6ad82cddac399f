"""Checkpoint prefixes on S3.

S3 has no rename, so a checkpoint is committed by its last object: the tensor files and
experiment.json are uploaded under `<prefix>/step-<n>/`, and only then `COMMITTED`. A prefix
without `COMMITTED` is not a checkpoint, whatever else it holds. Deleting removes the marker
first for the same reason.
"""

from __future__ import annotations

import re

from sexpgpu.errors import SexpgpuError
from sexpgpu.store import crash_points, s3_objects
from sexpgpu.store.checks import MARKER, STEP_NAME
from sexpgpu.store.s3_objects import TransferSettings
from sexpgpu.store.uris import MissingFile, join, split_s3

_STEP_KEY = re.compile(rf"(.*/)?{STEP_NAME.pattern}/(.+)")


class Writer:
    """One checkpoint being uploaded. `write` each file, then `commit`; `abort` on failure.

    With `replacing`, a committed checkpoint at the step (a damaged one: the caller checked)
    is uncommitted, its marker deleted first, before anything is uploaded; otherwise one found
    there is E-CKPT-004."""

    def __init__(self, root: str, step: int, settings: TransferSettings | None = None, replacing: bool = False):
        self.final = join(root, f"step-{step}")
        self.settings = settings or TransferSettings.from_env()
        self.written: list[str] = []
        # Objects left by an earlier, uncommitted attempt at this step are not a checkpoint;
        # clear them so that none outlives this one.
        stale = s3_objects.list_keys(self.final + "/", "clearing an unfinished checkpoint at")
        if join(self.final, MARKER) in stale and not replacing:
            raise SexpgpuError("E-CKPT-004", f"{self.final} is already committed; it was left as it is.")
        _delete_marker_first(self.final, stale, "clearing an unfinished checkpoint at")
        crash_points.reached("start")

    def write(self, name: str, buffers, nbytes: int) -> str:
        uri = join(self.final, name)
        self.written.append(uri)

        def after_part(count):
            if count == 1:
                crash_points.reached(f"mid:{name}")

        _, sha = s3_objects.put_object(uri, buffers, nbytes, "writing", self.settings, after_part)
        crash_points.reached(f"file:{name}")
        return sha

    def commit(self, marker: bytes) -> str:
        crash_points.reached("commit")
        s3_objects.put_object(join(self.final, MARKER), [marker], len(marker), "committing", self.settings)
        return self.final

    def abort(self, error: BaseException | None = None) -> None:
        if error is not None and s3_objects.unreachable(error):
            return  # the deletes would wait as long; without a marker the objects are not a checkpoint
        try:
            s3_objects.delete_keys(self.written, "removing an unfinished checkpoint at")
        except Exception:
            pass  # Unreachable now; without a marker the objects are not a checkpoint anyway.


def read_whole(uri: str, settings: TransferSettings | None = None) -> tuple[bytearray, str]:
    data, _, sha = s3_objects.get_object(uri, "reading", settings or TransferSettings.from_env())
    return data, sha


def read_head(uri: str, count: int) -> tuple[bytes, int]:
    data, total, _ = s3_objects.get_range(uri, 0, count, "reading")
    return data, total


def read_small(uri: str) -> bytes:
    return s3_objects.get_bytes(uri, "reading")


def committed_steps(root: str) -> dict[int, str]:
    """{step: prefix} of every committed checkpoint directly under `root`."""
    return {step: join(root, f"step-{step}") for step, names in _step_objects(root).items() if MARKER in names}


def _step_objects(root: str) -> dict[int, list[str]]:
    """{step: [object names]} for every `step-<n>/` prefix directly under `root`."""
    base = root.rstrip("/") + "/"
    prefix = split_s3(base)[1]
    steps: dict[int, list[str]] = {}
    for uri in s3_objects.list_keys(base, "listing checkpoints in"):
        match = _STEP_KEY.fullmatch(split_s3(uri)[1])
        if match and (match.group(1) or "") == prefix:
            steps.setdefault(int(match.group(2)), []).append(match.group(3))
    return dict(sorted(steps.items()))


def uncommitted_steps(root: str) -> dict[int, str]:
    """{step: prefix} of the `step-<n>/` prefixes under `root` that hold objects but no marker."""
    return {step: join(root, f"step-{step}") for step, names in _step_objects(root).items() if MARKER not in names}


def is_committed(uri: str) -> bool:
    try:
        s3_objects.get_range(join(uri, MARKER), 0, 1, "reading")
        return True
    except MissingFile:
        return False


def remove_step(uri: str) -> None:
    _delete_marker_first(uri, s3_objects.list_keys(uri.rstrip("/") + "/", "deleting"), "deleting")


def _delete_marker_first(uri: str, keys: list[str], doing: str) -> None:
    """Delete a step's objects, its marker first: a crash midway leaves no checkpoint that counts."""
    marker = join(uri, MARKER)
    s3_objects.delete_keys([k for k in keys if k == marker] + [k for k in keys if k != marker], doing)


def remove_partials(root: str, up_to_step: int) -> None:
    """Delete the objects of uncommitted prefixes, left by crashed writers, up to `up_to_step`."""
    for step, names in _step_objects(root).items():
        if step <= up_to_step and MARKER not in names:
            prefix = join(root, f"step-{step}")
            s3_objects.delete_keys([join(prefix, name) for name in names], "clearing an unfinished checkpoint at")
