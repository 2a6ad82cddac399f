"""The metrics log: `metrics.jsonl`, one JSON object a line, written as each step ends.

It holds only values that are functions of the file (no timings), so two runs of the same
file, selection and flags give identical logs.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass

import numpy as np

from sexpgpu.run.rundir import run_dir_errors


def float_bits(value) -> str:
    """The float32 bit pattern, so that logs compare exactly without parsing decimals."""
    return f"{int(np.float32(value).view(np.uint32)):08x}"


class MetricsLog:
    """Appends whole lines: each is one write() of its bytes on a file opened for appending.
    A write the disk cuts short (full, quota, file-size limit) is cut back off, so the log
    always ends with a whole line, and the run stops with E-DISK-001."""

    def __init__(self, path: str, append: bool = False):
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        with run_dir_errors(path, "open"):
            self.fd = os.open(path, flags, 0o644)
            self.size = os.fstat(self.fd).st_size

    def write(self, record: dict) -> None:
        line = (json.dumps(record, sort_keys=False) + "\n").encode("utf-8")
        with run_dir_errors(self.path, f"append step {record.get('step')}'s line ({len(line)} bytes) to"):
            try:
                written = os.write(self.fd, line)
            except OSError:
                os.ftruncate(self.fd, self.size)  # a write that failed may still have left bytes
                raise
            if written != len(line):
                os.ftruncate(self.fd, self.size)
                raise OSError(errno.ENOSPC, f"the disk took only {written} of them")
        self.size += len(line)

    def sync(self) -> None:
        with run_dir_errors(self.path, "sync"):
            os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Trimmed:
    """What `truncate_after_step` dropped: lines of later steps, and a torn last line."""

    later_lines: int
    torn_bytes: int

    def note(self, path: str) -> str | None:
        if not self.torn_bytes:
            return None
        return (f"{path}: its last line was torn ({self.torn_bytes} bytes without a whole JSON line, "
                "left by a crash or a full disk) and was dropped; the steps after the checkpoint run again.")


def truncate_after_step(path: str, step: int) -> Trimmed:
    """Drop the lines of steps after `step` (a resumed run rewrites them, bit for bit) and a
    torn line: one that does not end with a newline or is not a JSON object. Lines after a
    torn one are dropped too. The file is cut in place, never rewritten."""
    if not os.path.exists(path):
        return Trimmed(0, 0)
    with open(path, "rb") as handle:
        lines = handle.readlines()
    kept_bytes, later, torn = 0, 0, 0
    for index, line in enumerate(lines):
        record = _whole_record(line)
        if record is None:
            torn = sum(len(rest) for rest in lines[index:])
            break
        if record.get("step", 0) > step:
            later = len(lines) - index
            break
        kept_bytes += len(line)
    with run_dir_errors(path, "cut the torn or later lines off"):
        os.truncate(path, kept_bytes)
    return Trimmed(later, torn)


def _whole_record(line: bytes) -> dict | None:
    if not line.endswith(b"\n"):
        return None
    try:
        record = json.loads(line)
    except ValueError:  # also UnicodeDecodeError
        return None
    return record if isinstance(record, dict) else None
