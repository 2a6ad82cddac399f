"""Files written whole or not at all, and the one advisory lock, for every writer in sexpgpu.

`write_atomically` writes a temporary file beside the file (`.tmp-<name>-<random>`), fsyncs
it, renames it over the file and fsyncs the folder: a crash before the rename leaves the old
file, after it the new one, on the disk as in memory. The lock is flock's, which the kernel
drops when the process ends however it ends: a killed process leaves no stale lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets

TEMPORARY_PREFIX = ".tmp-"


def write_atomically(path: str, content: str | bytes) -> None:
    """Replace the file `path` (its folder made if missing) by `content`, text as UTF-8."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f"{TEMPORARY_PREFIX}{os.path.basename(path)}-{secrets.token_hex(6)}")
    data = content.encode() if isinstance(content, str) else content
    try:
        # os.open, not mkstemp: the file takes the umask's mode, as open() would have made it
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_directory(folder)


def fsync_directory(path: str) -> None:
    """Make the folder's entries (a file created, renamed or deleted there) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock(fd: int, shared: bool = False, wait: bool = True) -> bool:
    """Take the lock of the file open at `fd`, exclusive unless `shared`, until `fd` is closed.
    Without `wait`: False, at once, when another process holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked(path: str):
    """The exclusive lock of the file `path` (made, with its folder, if missing) while the
    block runs; another process's waits."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        lock(fd)
        yield
    finally:
        os.close(fd)  # which lets the lock go
