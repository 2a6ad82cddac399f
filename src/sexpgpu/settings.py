"""Every `SEXPGPU_*` setting in one table: its name, the values it takes, its default and what
it does. `check_environment()` runs at the start of every command, on every backend, so a
value no code would accept stops the command with E-CONFIG-001 before any work, whichever
code would have read it. Code that reads a setting calls `value(name)`, which parses it the
same way. docs/settings.md is this table for people (a test keeps the two alike).

A `SEXPGPU_*` name that is not in the table is ignored with a warning that suggests the nearest
known name: an unknown name cannot change a run, and a warning keeps environments that carry
other tools' variables working.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from sexpgpu.errors import SexpgpuError, nearest_name

PREFIX = "SEXPGPU_"
MIB = 1024 * 1024
GIB = 1024 * MIB
# S3's multipart limits: every part but the last is 5 MiB to 5 GiB, and an upload has at most 10,000 parts.
S3_MIN_PART, S3_MAX_PART, S3_MAX_PARTS = 5 * MIB, 5 * GIB, 10_000


@dataclass(frozen=True)
class Setting:
    name: str
    allowed: str  # the values it takes, as the error message and the docs say them
    default: str
    meaning: str
    parse: Callable[[str], object]  # text -> value, or ValueError


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        word = text.strip().lower()
        if word not in choices:
            raise ValueError
        return word

    return parse


# Numbers are ASCII: Python's int() and float() also take other scripts' digits ('١', '１').
def _integer(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        digits = text.strip().replace("_", "")
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 30 or not low <= int(digits) <= high:
            raise ValueError
        return int(digits)

    return parse


def _seconds(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        if not text.isascii():
            raise ValueError
        seconds = float(text)
        if not low <= seconds <= high:  # nan is in no range
            raise ValueError
        return seconds

    return parse


def _choices_source(text: str) -> str:
    """`fresh`, or where recorded choices are: a path or an s3://bucket/prefix URI."""
    source = text.strip()
    if not source or (source.startswith("s3://") and not source[len("s3://"):].split("/")[0]):
        raise ValueError
    return "fresh" if source.lower() == "fresh" else source


def _any_text(text: str) -> str:
    return text


SETTINGS = {setting.name: setting for setting in (
    Setting("SEXPGPU_OPTIMIZE", "on, off", "on",
            "how much the CUDA backend fuses: `off` gives every node its own kernel and captures no "
            "CUDA graph; both give the same bits", _one_of("on", "off")),
    Setting("SEXPGPU_PATTERNS", "on, off", "on",
            "whether the CUDA backend lowers cuDNN's native pattern graphs (fused bf16 attention, forward and "
            "backward; bf16 products, and convolutions, with their bias and activation) where cuDNN supports them "
            "on the device; `off`: none. The report's `patterns` line says which are on, and why the others "
            "are off. Part of a run's bits, of its recorded device and of what a resume checks", _one_of("on", "off")),
    Setting("SEXPGPU_DETERMINISTIC", "0, 1", "0",
            "`1` is `--deterministic`: no measured choices", _one_of("0", "1")),
    Setting("SEXPGPU_CHOICES", "fresh, or a path or s3://bucket/prefix", "(none)",
            "where a run's machine choices come from, as `--choices`", _choices_source),
    Setting("SEXPGPU_NODE_GRADIENTS", "bf16, f32", "bf16",
            "the dtype of gradients summed between nodes", _one_of("bf16", "f32")),
    Setting("SEXPGPU_DIST_TIMEOUT", "seconds, from 1 to 86400", "600",
            "how long a process of a run on several processes (docs/distributed.md) waits for the others: to "
            "join them, and at each exchange of a step; then it stops with E-DIST-004", _seconds(1, 86400)),
    Setting("SEXPGPU_DIST_FILE", "a file path every process can reach", "(none)",
            "where the processes of a run on several processes meet: a file (torch's FileStore) instead of "
            "torchrun's store at MASTER_ADDR:MASTER_PORT, so that nothing listens for the meeting; the tests' "
            "worlds meet this way", _any_text),
    Setting("SEXPGPU_CPU_THREADS", "an integer from 1 to 1024", "the usable CPUs, at most 8",
            "threads the CPU interpreter splits large kernels over; never changes bits", _integer(1, 1024)),
    Setting("SEXPGPU_HOST_MEMORY", "bytes, an integer from 1 to 2^62", "(measured)",
            "the host memory a run takes as available, instead of what the machine reports (MemAvailable, the "
            "cgroup's limit, ulimit -v); a run on the CPU interpreter plans at most 90% of it, else stops before its "
            "first step with E-MEM-002", _integer(1, 2**62)),
    Setting("SEXPGPU_NONFINITE", "stop, continue", "stop",
            "what a run does when a step's loss is NaN or infinite: `stop` ends it with E-NUM-001 before that step's "
            "update, naming the first value that was not finite, and writes no checkpoint of parameters or optimizer "
            "state that are not finite; `continue` goes on. Never changes bits", _one_of("stop", "continue")),
    Setting("SEXPGPU_S3_PART_SIZE", f"bytes, an integer from {S3_MIN_PART} (5 MiB) to {S3_MAX_PART} (5 GiB)",
            str(64 * MIB), "the size of each part of a multipart S3 upload or ranged read",
            _integer(S3_MIN_PART, S3_MAX_PART)),
    Setting("SEXPGPU_S3_MULTIPART_THRESHOLD", f"bytes, an integer from 1 to {S3_MAX_PART}", str(64 * MIB),
            "objects this large or larger are uploaded in parts", _integer(1, S3_MAX_PART)),
    Setting("SEXPGPU_S3_WORKERS", "an integer from 1 to 64", "4",
            "parallel S3 part transfers", _integer(1, 64)),
    Setting("SEXPGPU_S3_TIMEOUT", "seconds, from 1 to 86400", "120",
            "how long one S3 request (a listing page, an object or a part of one, each way) may wait for its "
            "answer, its attempts included; then the command stops with E-S3-001", _seconds(1, 86400)),
    Setting("SEXPGPU_S3_ATTEMPTS", "an integer from 1 to 10", "3",
            "attempts of one S3 request (botocore's standard retries); each may wait SEXPGPU_S3_TIMEOUT divided "
            "by this, and at most 10 s to connect", _integer(1, 10)),
    Setting("SEXPGPU_S3_NOTICE", "seconds, from 0.1 to 3600", "10",
            "after this long without an answer from S3, and again at each such interval, a line on stderr says "
            "what the command is waiting for", _seconds(0.1, 3600)),
    Setting("SEXPGPU_DEBUG", "0, 1", "0",
            "`1` shows the Python traceback of an internal error", _one_of("0", "1")),
    Setting("SEXPGPU_TEST_CHECKPOINT_KILL_AT", "a crash point name (docs/checkpoints.md)", "(none)",
            "tests only: the process kills itself at that point of a checkpoint write", _any_text),
    Setting("SEXPGPU_NUMERICS_REPORT", "a file path", "(none)",
            "tests only: the JSON-lines file the GPU numerics tests append their counts to; sexpgpu never "
            "reads it", _any_text),
    Setting("SEXPGPU_TEST_CHECKPOINT_SLEEP", "seconds, from 0 to 3600", "(none)",
            "tests only: a pause at every crash point", _seconds(0, 3600)),
)}


MAX_NAME = max(len(name) for name in SETTINGS)


def value(name: str, environ=None):
    """The parsed value of a known setting, or None when it is unset or blank (empty, or only
    whitespace): for every setting, a blank value is an unset one."""
    environ = os.environ if environ is None else environ
    setting = SETTINGS[name]
    text = environ.get(name, "")
    if not text.strip():
        return None
    try:
        return setting.parse(text)
    except ValueError:
        raise SexpgpuError("E-CONFIG-001", f"{name} is '{_shown(text)}': expected {setting.allowed}.",
                           hint=f"Unset it for the default ({setting.default}); docs/settings.md lists every setting.") from None


def recorded(names, environ=None) -> dict[str, str]:
    """The settings among `names` that are set, each as its parsed value's text: what a run
    records of them, so that `OFF`, ` off ` and `off` are one value and a blank one none."""
    return {name: str(found) for name in names if (found := value(name, environ)) is not None}


def as_recorded(record: dict) -> dict:
    """A record of settings as `recorded` writes it now; one written raw by an older sexpgpu
    may hold `Off` or a blank value. A value no setting takes is kept as it is."""
    now = {}
    for name, text in record.items():
        if name not in SETTINGS or not isinstance(text, str):
            now[name] = text
            continue
        try:
            now.update(recorded([name], {name: text}))
        except SexpgpuError:  # kept, so that a resume's E-CKPT-002 names it
            now[name] = text
    return now


def resolved(name: str, environ=None) -> str:
    """A known setting's value as text: the parsed value, or its default when unset."""
    found = value(name, environ)
    return SETTINGS[name].default if found is None else str(found)


def check_part_count(nbytes: int, part_size: int) -> None:
    """S3 takes at most 10,000 parts an upload: refuse, before uploading, an object that needs more."""
    if nbytes > S3_MAX_PARTS * part_size:
        least = -(-nbytes // S3_MAX_PARTS)
        raise SexpgpuError("E-CONFIG-001", f"an object of {nbytes} bytes needs more than S3's 10,000 parts of "
                           f"SEXPGPU_S3_PART_SIZE={part_size} bytes: expected a part size of at least {least}.")


def check_environment(environ=None) -> list[str]:
    """Parse every known setting (E-CONFIG-001 on the first bad one) and return one warning
    for each unknown `SEXPGPU_*` name."""
    environ = os.environ if environ is None else environ
    warnings = []
    for name in sorted(key for key in environ if key.startswith(PREFIX)):
        if name in SETTINGS:
            value(name, environ)
            continue
        # The edit distance is quadratic in the name's length: no suggestion for a very long name.
        suggestion = nearest_name(name, SETTINGS) if len(name) <= 2 * MAX_NAME else None
        guess = f" Did you mean {suggestion}?" if suggestion else ""
        warnings.append(f"warning: {_shown(name)} is not a setting sexpgpu knows, so it changes nothing.{guess}")
    return warnings


def _shown(text: str) -> str:
    """At most 60 characters, control characters escaped."""
    cut = text if len(text) <= 60 else text[:60] + "..."
    return cut.encode("unicode_escape").decode("ascii")
