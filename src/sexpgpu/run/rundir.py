"""A run directory belongs to one run.

Before its first step a run claims its directory: it creates it, takes an exclusive lock on
`run.lock` there for its whole life (files.py's `lock`, flock's, which the kernel drops when the process
ends, however it ends), and writes its pid and host into that file so that a second process
can name the holder (E-RUN-002). A fresh run (no `--resume`) refuses a directory that already
holds another run's files, before it writes anything (E-RUN-001). A local checkpoint
destination other than the run directory is claimed the same way. Every destination the run
will write is tried before the first step: the run directory (E-RUN-003), a local checkpoint
directory (E-DISK-001/002) and an S3 prefix (E-S3-001..004), so that a bad one costs no
training.

A run refused before its first step (a bad resume, choices it cannot take, a destination
that fails) leaves nothing it made (`Made`): the files it created (run.lock among them), then
the directories it created, parents included, if empty. A directory that was there before
keeps what it held. A lock file is deleted only by the process holding its lock, and a
process that locks one checks that the file it locked still bears the name (`still_named`):
one that opened it just before the deletion would otherwise hold a file no one else sees.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import NamedTuple

from sexpgpu.errors import SexpgpuError
from sexpgpu.files import lock
from sexpgpu.store import list_checkpoints
from sexpgpu.store.local_store import STEP_NAME, UNFINISHED_NAME, disk_errors
from sexpgpu.store.s3_objects import TransferSettings, delete_keys, put_object
from sexpgpu.store.uris import is_s3, join

LOCK_NAME = "run.lock"
RUN_FILES = ("experiment.json", "report.txt", "metrics.jsonl")
RUNS_FOLDER = "runs"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.+=-]")
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@dataclass
class Claim:
    """A directory this process holds the lock of; `release` when the run ends."""

    path: str
    fd: int

    def release(self) -> None:
        os.close(self.fd)


@dataclass
class Made:
    """What a run has made before its first step, and the directories it holds. Until `keep`
    (the first step begins), `undo` removes what it made: the files it created, then the
    directories it created, innermost first and only while empty (another run may have begun
    in one). `release` lets go of the locks, after any undo: a lock file is deleted while held."""

    directories: list[str] = field(default_factory=list)  # outermost first
    files: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    kept: bool = False

    def directory(self, path: str) -> None:
        """Before `path` is created with its parents: note those that do not exist yet."""
        missing, place = [], os.path.abspath(path)
        while not os.path.lexists(place) and place != os.path.dirname(place):
            missing.append(place)
            place = os.path.dirname(place)
        self.directories += [made for made in reversed(missing) if made not in self.directories]

    def file(self, path: str) -> None:
        """Before `path` is written: note it, unless it is there already (then it is not ours)."""
        if not os.path.lexists(path):
            self.files.append(path)

    def keep(self) -> None:
        self.kept = True

    def undo(self) -> None:
        if self.kept:
            return
        for path in reversed(self.files):
            with suppress(OSError):
                os.unlink(path)
        for path in reversed(self.directories):
            with suppress(OSError):  # not empty: something else is in it now
                os.rmdir(path)

    def release(self) -> None:
        for held in self.claims:
            held.release()


def default_run_dir(run_name: str, made: Made | None = None) -> str:
    """A new folder under runs/, created here so that two runs started in the same second get
    two folders. The run's name is made one plain path component: it cannot leave runs/."""
    made = made or Made()
    base = os.path.join(RUNS_FOLDER, f"{safe_component(run_name)}-{time.strftime('%Y%m%d-%H%M%S')}")
    with run_dir_errors(base, "create"):
        made.directory(RUNS_FOLDER)
        os.makedirs(RUNS_FOLDER, exist_ok=True)
        for candidate in _numbered(base):
            try:
                os.mkdir(candidate)
            except FileExistsError:
                continue
            made.directories.append(os.path.abspath(candidate))
            return candidate


def unused_sibling(directory: str) -> str:
    """`<directory>-2`, `-3`, ...: the first that does not exist, for a run that cannot use `directory`."""
    later = itertools.islice(_numbered(os.path.normpath(directory)), 1, None)
    return next(candidate for candidate in later if not os.path.lexists(candidate))


def _numbered(base: str):
    """`base`, then `base-2`, `base-3`, ..."""
    yield base
    yield from (f"{base}-{number}" for number in itertools.count(2))


def recorded_checkpoints(run_dir: str) -> str | None:
    """Where the run directory's experiment.json says its checkpoints went, when not into the
    run directory itself; None when it says nothing or cannot be read (the caller falls back
    to the flags and the file)."""
    try:
        with open(os.path.join(run_dir, RUN_FILES[0]), encoding="utf-8") as handle:
            recorded = json.load(handle).get("checkpoints")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return recorded if isinstance(recorded, str) and recorded else None


def checkpoints_to_record(root: str, run_dir: str) -> str | None:
    """What the run directory records of its checkpoint destination: None for the run
    directory itself, an s3:// URI as it is, a local path made absolute (a resume may start
    in another working directory)."""
    if is_s3(root):
        return root
    return None if same_place(root, run_dir) else os.path.abspath(root)


def same_place(a: str, b: str) -> bool:
    """Whether two directories or S3 prefixes are one."""
    if is_s3(a) or is_s3(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def safe_component(name: str) -> str:
    """`name` with every character but letters, digits and `_.+=-` made `_`, and no leading dot."""
    cleaned = _SAFE_NAME.sub("_", name)
    return "_" + cleaned[1:] if cleaned.startswith(".") else cleaned


@contextmanager
def run_dir_errors(path: str, doing: str):
    """OSErrors on the run directory's files: E-DISK-001 when the disk is full, else E-RUN-003."""
    try:
        yield
    except OSError as error:
        if error.errno in _FULL:
            raise SexpgpuError("E-DISK-001", f"the disk is full: cannot {doing} {path}: {error.strerror}.",
                               hint="Free space and resume the run with --resume latest.") from None
        raise SexpgpuError("E-RUN-003", f"cannot {doing} {path}: {error.strerror or error}.",
                           hint="The run directory must be a directory this user can write; give another --run-dir.") from None


@contextmanager
def claimed(run_dir: str, checkpoint_root: str, fresh: bool, writes_checkpoints: bool, made: Made):
    """Hold the run directory (and a separate local checkpoint directory) for the block; if
    the block raises before `made.keep()`, remove what the run made (`Made`)."""
    try:
        claim(run_dir, fresh, RUN_DIRECTORY, made)
        if writes_checkpoints and not is_s3(checkpoint_root) and not same_place(run_dir, checkpoint_root):
            claim(checkpoint_root, fresh, CHECKPOINT_DIRECTORY, made)
        if writes_checkpoints and is_s3(checkpoint_root):
            check_s3_destination(checkpoint_root, fresh)
        yield
    except BaseException:
        made.undo()
        raise
    finally:
        made.release()


def claim(directory: str, fresh: bool, kind: DirectoryKind, made: Made) -> None:
    """Lock `directory`'s run.lock for the run (into `made.claims`), creating what is missing."""
    if fresh and os.path.isdir(directory):
        _refuse_while_held(directory)  # reads only: a refused run writes nothing
        _refuse_another_runs_files(directory, kind.flag)
    with kind.errors(directory, "create or write in"):
        made.directory(directory)
        os.makedirs(directory, exist_ok=True)
        _try_writing(directory)
    fd = _locked(directory, kind, made)
    if fresh:
        _refuse_another_runs_files(directory, kind.flag)  # again: a run may have started since the first look
    with kind.errors(directory, "write in"):
        _record_holder(fd)


def _locked(directory: str, kind: DirectoryKind, made: Made) -> int:
    """An fd on `directory`'s run.lock holding its exclusive lock, in `made.claims`; the file
    is this run's to delete (in `made.files`) only when this run created it."""
    path = os.path.join(directory, LOCK_NAME)
    while True:
        with kind.errors(directory, "create or write in"):
            fd, created = _open_lock(path)
        try:
            _lock(fd, directory)
        except BaseException:
            os.close(fd)
            raise
        if still_named(fd, path):
            made.claims.append(Claim(directory, fd))
            made.files += [path] if created else []
            return fd
        os.close(fd)  # deleted by a refused run after we opened it: lock the file that bears the name now


def _open_lock(path: str) -> tuple[int, bool]:
    """An fd on the lock file, and whether this call created it."""
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            pass
        with suppress(FileNotFoundError):  # deleted in between: create it then
            return os.open(path, os.O_RDWR), False


def still_named(fd: int, path: str) -> bool:
    """Whether the file open at `fd` is still the one `path` names."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _refuse_while_held(directory: str) -> None:
    try:
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY)
    except OSError:
        return  # no lock file, or none we can read: the claim proper decides
    try:
        _lock(fd, directory, shared=True)
    finally:
        os.close(fd)


def _lock(fd: int, directory: str, shared: bool = False) -> None:
    if not lock(fd, shared, wait=False):
        raise SexpgpuError("E-RUN-002", f"{directory} is in use by another sexpgpu run: {_describe_holder(fd)}. Two "
                           "runs in one directory would mix their metrics and delete each other's checkpoints.",
                           hint="Wait for that run to end, or give this one another --run-dir.")


def _checkpoint_errors(path: str, doing: str):
    return disk_errors(path, f"{doing} the checkpoint directory")


class DirectoryKind(NamedTuple):
    """A directory a run claims: how its OSErrors are reported, and the flag that names another."""

    errors: Callable
    flag: str


RUN_DIRECTORY = DirectoryKind(run_dir_errors, "--run-dir")
CHECKPOINT_DIRECTORY = DirectoryKind(_checkpoint_errors, "--checkpoint-to")


def _try_writing(directory: str) -> None:
    """Create and remove a file: the only test of writability that holds for root too."""
    fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=directory)
    os.close(fd)
    os.unlink(probe)


def _record_holder(fd: int) -> None:
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                         "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode() + b"\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)


def _describe_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
        return f"pid {int(holder['pid'])} on host {str(holder['host'])[:100]!r}, started {str(holder['started'])[:40]}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet written its pid"  # it holds the lock and is about to


def _refuse_another_runs_files(directory: str, flag: str) -> None:
    found = sorted(name for name in os.listdir(directory)
                   if name in RUN_FILES or STEP_NAME.fullmatch(name) or UNFINISHED_NAME.fullmatch(name))
    if found:
        shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
        raise SexpgpuError("E-RUN-001", f"{directory} already holds another run's files ({shown}); a new run "
                           "there would overwrite them.", hint=_elsewhere_hint(directory, flag))


def _elsewhere_hint(directory: str, flag: str) -> str:
    """A way forward from E-RUN-001 that works: --resume latest only where there is a checkpoint
    to resume (a run stopped before its first one has none), and a directory that is free."""
    elsewhere = f"give this one another {flag}, such as {unused_sibling(directory)}"
    if list_checkpoints(directory) or recorded_checkpoints(directory):
        return f"Continue that run with --resume latest, or {elsewhere}."
    return f"It holds no checkpoint to resume from: {elsewhere}, or move those files away first."


def check_s3_destination(root: str, fresh: bool) -> None:
    """Before the first step: a fresh run's checkpoints must not land among another run's, and
    the prefix must take a write. S3 has no lock: two runs sharing a prefix are not detected."""
    steps = [step for step, _ in list_checkpoints(root)] if fresh else []
    if steps:
        raise SexpgpuError("E-RUN-001", f"the checkpoint destination {root} already holds another run's committed "
                           f"checkpoints (steps {steps[:8]}); a new run there would overwrite them.",
                           hint="Continue that run with --resume latest, or send this run's checkpoints elsewhere "
                                "with --checkpoint-to.")
    probe = join(root, f".write-check-{uuid.uuid4().hex}")
    put_object(probe, [b""], 0, "checking that the run can write", TransferSettings.from_env())
    delete_keys([probe], "removing the write check")
