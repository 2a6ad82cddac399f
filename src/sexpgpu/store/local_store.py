"""Checkpoint directories on a local disk.

A checkpoint is written into `<root>/.step-<n>.partial-<random suffix>/`, every file fsynced, then the
commit marker, then the directory fsynced and renamed to `<root>/step-<n>/`, and the root
fsynced. A crash before the rename leaves only a `.partial` directory, which nothing reads.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.files import fsync_directory
from sexpgpu.store import crash_points
from sexpgpu.store.checks import MARKER, STEP_NAME
from sexpgpu.store.digests import CHUNK_BYTES, BackgroundSha256, chunks
from sexpgpu.store.uris import MissingFile

# A writer's temporary directory, or one being deleted: never a checkpoint, even with a marker.
UNFINISHED_NAME = re.compile(r"\.step-(\d+)\.(partial-.*|deleting)")
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@contextmanager
def disk_errors(path: str, doing: str, nbytes: int | None = None):
    """OSErrors while writing become E-DISK-001 (no space) or E-DISK-002 (anything else)."""
    try:
        yield
    except OSError as error:
        if error.errno in _FULL:
            need = f" ({nbytes} bytes to write)" if nbytes is not None else ""
            raise SexpgpuError("E-DISK-001", f"the disk is full: cannot {doing} {path}{need}: {error.strerror}.",
                               hint="Free space or point the checkpoints elsewhere; nothing already written was changed.") from None
        raise SexpgpuError("E-DISK-002", f"cannot {doing} {path}: {error.strerror or error}.") from None


class Writer:
    """One checkpoint being written. `write` each file, then `commit`; `abort` on failure.

    With `replacing`, a committed checkpoint at the step (a damaged one: the caller checked)
    is renamed away when this one takes its name, and deleted once this one is durable;
    otherwise one found at the commit is E-CKPT-004."""

    def __init__(self, root: str, step: int, replacing: bool = False):
        self.final = os.path.join(root, f"step-{step}")
        self.root = root
        self.replacing = replacing
        with disk_errors(root, "create a checkpoint in"):
            os.makedirs(root, exist_ok=True)
            self.temp = tempfile.mkdtemp(prefix=f".step-{step}.partial-", dir=root)
        crash_points.reached("start")

    def write(self, name: str, buffers, nbytes: int) -> str:
        """Write one file from its buffers and fsync it; returns its SHA-256."""
        path = os.path.join(self.temp, name)
        half, written = nbytes // 2, 0
        with (disk_errors(path, "write", nbytes), open(path, "wb", buffering=0) as file,
              BackgroundSha256() as digest, _Flusher(file.fileno()) as flusher):
            for piece in chunks(buffers, CHUNK_BYTES):
                digest.update(piece)
                _write_all(file, piece)
                flusher.kick()
                if written < half <= written + len(piece):
                    crash_points.reached(f"mid:{name}")
                written += len(piece)
            flusher.finish()
            sha = digest.hexdigest()
        crash_points.reached(f"file:{name}")
        return sha

    def commit(self, marker: bytes) -> str:
        """Write the marker, make the directory durable and give it its final name."""
        self.write(MARKER, [marker], len(marker))
        crash_points.reached("commit")
        with disk_errors(self.final, "commit"):
            fsync_directory(self.temp)
            if is_committed(self.final) and not self.replacing:
                raise SexpgpuError("E-CKPT-004", f"{self.final} appeared while this checkpoint was written; it was left as it is.")
            # What is at step-<n> now (an interrupted write without its marker, or a damaged
            # checkpoint being replaced) is renamed away before ours takes its name, and only
            # deleted once ours is durable: a crash in between leaves no step-<n> at all.
            previous = _set_aside(self.final) if os.path.lexists(self.final) else None
            os.rename(self.temp, self.final)
            fsync_directory(self.root)
            if previous:
                _remove(previous)
        return self.final

    def abort(self, error: BaseException | None = None) -> None:
        shutil.rmtree(self.temp, ignore_errors=True)


class _Flusher:
    """fdatasync on a worker thread while the next chunks are written, so the disk writes
    back the file as it grows instead of all at the final fsync."""

    def __init__(self, fd: int):
        self._fd = fd
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fdatasync")
        self._running = None

    def kick(self) -> None:
        if self._running is None or self._running.done():
            if self._running is not None:
                self._running.result()  # an error in writeback (ENOSPC) surfaces here
            self._running = self._pool.submit(os.fdatasync, self._fd)

    def finish(self) -> None:
        if self._running is not None:
            self._running.result()
        os.fsync(self._fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True)


def _write_all(file, view: memoryview) -> None:
    while view:
        count = file.write(view)
        view = view[count:]


@contextmanager
def _reading(path: str):
    """No file where one should be (or a directory in its place) is MissingFile; any other
    failure to read is E-DISK-002."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise MissingFile(path) from None
    except OSError as error:
        raise SexpgpuError("E-DISK-002", f"cannot read {path}: {error.strerror or error}.") from None


def read_whole(path: str) -> tuple[np.ndarray, str]:
    """A file's bytes (a uint8 array) and SHA-256, hashing each chunk while the next is read."""
    with _reading(path):
        size = os.stat(path).st_size
        # np.empty, not bytearray: zero-filling a large buffer first costs as much as the read.
        data = np.empty(size, dtype=np.uint8)
        view = memoryview(data)
        with open(path, "rb", buffering=0) as file, BackgroundSha256() as digest:
            position = 0
            while position < size:
                count = file.readinto(view[position : position + CHUNK_BYTES])
                if not count:
                    break
                digest.update(view[position : position + count])
                position += count
            return (data if position == size else data[:position]), digest.hexdigest()


def read_head(path: str, count: int) -> tuple[bytes, int]:
    """The first `count` bytes of a file and its size."""
    with _reading(path), open(path, "rb") as file:
        return file.read(count), os.fstat(file.fileno()).st_size


def read_small(path: str) -> bytes:
    return read_head(path, 1 << 30)[0]


def committed_steps(root: str) -> dict[int, str]:
    """{step: directory} of every committed checkpoint directly under `root`."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    steps = {}
    for name in names:
        match = STEP_NAME.fullmatch(name)
        if match and os.path.isfile(os.path.join(root, name, MARKER)):
            steps[int(match.group(1))] = os.path.join(root, name)
    return dict(sorted(steps.items()))


def is_committed(path: str) -> bool:
    unfinished = UNFINISHED_NAME.fullmatch(os.path.basename(os.path.normpath(path)))
    return not unfinished and os.path.isfile(os.path.join(path, MARKER))


def uncommitted_steps(root: str) -> dict[int, str]:
    """{step: path} of the steps under `root` that a writer began and never committed: a
    `step-<n>` without its marker, or a writer's `.partial` directory."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {}
    for name in sorted(names):
        match = STEP_NAME.fullmatch(name) or UNFINISHED_NAME.fullmatch(name)
        if match and not name.endswith(".deleting") and not os.path.isfile(os.path.join(root, name, MARKER)):
            found.setdefault(int(match.group(1)), os.path.join(root, name))
    return dict(sorted(found.items()))


def remove_step(path: str) -> None:
    """Uncommit first (rename away), then delete, so a crash midway leaves no half checkpoint."""
    with disk_errors(path, "delete"):
        shutil.rmtree(_set_aside(path))


def _set_aside(path: str) -> str:
    """Rename `path` to its `.deleting` name, which nothing reads, and return that name."""
    doomed = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.deleting")
    _remove(doomed)
    os.rename(path, doomed)
    return doomed


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def remove_partials(root: str, up_to_step: int) -> None:
    """Delete `.partial` and `.deleting` leftovers of crashed writers for steps up to `up_to_step`."""
    for name in os.listdir(root):
        match = UNFINISHED_NAME.fullmatch(name)
        if match and int(match.group(1)) <= up_to_step:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
