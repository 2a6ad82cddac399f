"""Runs fuzz cases through the CLI's `main`, in a worker process, with a time limit a case.

The worker is a long-lived child (multiprocessing's forkserver: a clean, single-threaded parent
with the CLI already imported, so a new worker costs a fork, and no thread pool of the test
process is inherited half-alive). It takes a case, writes it to `case.sexp` in its own
directory with any other file the case reads (a record file), sets the case's environment
variables, calls `main(["check", "case.sexp"])` (and for a run case then `main(["run", ...])`
for two steps on the CPU, its checkpoints on the test S3 server for a case that says so) and
sends back the outcome, the environment restored. A case that does not answer within its
time limit is a hang: the worker is killed and a new one takes the next case. A worker that
dies is a crash.

The contract every case must meet (docs/errors.md): exit 0, or exit 2 with `error E-AREA-NNN`,
placed at `FILE:LINE:COLUMN` when the error is about the file's text; no exit 3, no traceback,
no raw control character in a message, no hang.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import multiprocessing
import os
import re
import resource
import shutil
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from fuzz_environment import make_environment_case
from fuzz_mutators import EXAMPLES, Case, make_case
from fuzz_records import make_record_case

CASE_FILE = "case.sexp"
# The kinds of case, each made by a function (index, seeds, runnable, plan) -> Case: mutated
# experiment files, record files (fuzz_records.py), environment values (fuzz_environment.py).
KINDS = {"files": make_case, "records": make_record_case, "environment": make_environment_case}
# Areas whose errors are about the file's text, so they carry its line and column.
PLACED_AREAS = frozenset({"READ", "FORM", "GRAPH", "SHAPE", "DTYPE"})
# Areas `check` covers: a `run` of a file that `check` accepted must not fail with one of these.
CHECK_AREAS = PLACED_AREAS | {"SELECT"}
_ERROR_LINE = re.compile(r"^(?:(?P<file>.*?):(?P<line>\d+):(?P<column>\d+): )?error (?P<code>E-(?P<area>[A-Z][A-Z0-9]*)-\d{3}): ",
                         re.M)
# Control characters a message must show escaped: C0 but newline and tab, DEL, C1.
_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Each worker may grow its address space by this much, so that a runaway allocation fails with
# MemoryError in the worker instead of taking the machine's memory from everyone else.
WORKER_MEMORY = 4 << 30
FAILURE_LABELS = ("internal", "traceback", "uncoded", "unplaced", "raw-control", "escaped",
                  "check-accepts-run-refuses", "check-run-disagree", "hang", "crash")


@dataclass(frozen=True)
class Outcome:
    """What one command did to one case: `label` is 'ok', the error code, or a failure class."""
    label: str
    failed: bool
    detail: str = ""
    cpu_seconds: float = 0.0  # the worker's CPU time for the case: a figure the machine's load does not inflate


def classify(status, stderr: str, stdout: str = "") -> Outcome:
    """The outcome of one call of `main`, judged against the contract of docs/errors.md."""
    if "Traceback (most recent call last)" in stderr + stdout:
        return Outcome("traceback", True, _excerpt(stderr))
    if status == 0:
        return Outcome("ok", False)
    if status == 3:
        return Outcome("internal", True, _excerpt(stderr))
    if status != 2:
        return Outcome("escaped" if status == "escaped" else f"status-{status}", True, _excerpt(stderr))
    errors = list(_ERROR_LINE.finditer(stderr))
    if not errors:
        return Outcome("uncoded", True, _excerpt(stderr))
    error = errors[-1]
    message = stderr[error.start():].split("\n", 1)[0]
    if error["area"] in PLACED_AREAS and error["file"] != CASE_FILE:
        return Outcome("unplaced", True, _excerpt(message))
    if error["area"] == "SELECT" and CASE_FILE not in message:
        return Outcome("unplaced", True, _excerpt(message))
    if _RAW_CONTROL.search(message):
        return Outcome("raw-control", True, _excerpt(message))
    return Outcome(error["code"], False)


def judge_run(check: Outcome, run: Outcome) -> Outcome:
    """A run case: `run` must agree with `check` on the file. A file `check` accepts may fail
    in `run` only for what `check` cannot see (data contents, run-time values)."""
    if check.failed:
        return check
    if run.failed:
        return run
    if check.label == "ok" and _area(run.label) in CHECK_AREAS:
        return Outcome("check-accepts-run-refuses", True, f"run gave {run.label}: {run.detail}")
    if check.label != "ok" and run.label != check.label:
        return Outcome("check-run-disagree", True, f"check gave {check.label}, run {run.label}")
    return run


def _area(label: str) -> str | None:
    """'FORM' for 'E-FORM-011'; None for a label that is not a code."""
    return label.split("-")[1] if label.startswith("E-") else None


def _excerpt(text: str, limit: int = 400) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit // 2] + " ... " + text[-limit // 2:]


# -- the worker -------------------------------------------------------------------------------

def _call_main(main, argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    except SystemExit as stop:
        status = stop.code
    except BaseException:  # noqa: BLE001 - anything escaping main breaks the contract
        err.write(traceback.format_exc())
        status = "escaped"
    return status, out.getvalue(), err.getvalue()


class S3Target(NamedTuple):
    """Where a case that writes to S3 writes: the test server's AWS_* environment and a bucket."""
    environment: dict
    bucket: str


# With these, a request that an AWS_* value sends elsewhere than the test server (a blank
# endpoint is AWS's own) goes to a proxy where nothing listens, and fails at once on loopback.
OFF_LOOPBACK = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
                "NO_PROXY": "127.0.0.1,localhost", "AWS_EC2_METADATA_DISABLED": "true"}


def _execute(main, case: Case, s3: S3Target | None = None) -> Outcome:
    started = time.process_time()
    with _environment(case, s3):
        outcome = _judge_case(main, case, s3)
    return dataclasses.replace(outcome, cpu_seconds=time.process_time() - started)


@contextlib.contextmanager
def _environment(case: Case, s3: S3Target | None):
    """The case's variables set (on the test server's AWS_* environment for an S3 case), and
    the environment as it was afterwards."""
    kept = dict(os.environ)
    try:
        if case.s3 and s3 is not None:
            for name in [name for name in os.environ if name.startswith("AWS_")]:
                del os.environ[name]
            os.environ.update({**s3.environment, **OFF_LOOPBACK})
        os.environ.update(dict(case.environ))
        yield
    finally:
        os.environ.clear()
        os.environ.update(kept)


def _judge_case(main, case: Case, s3: S3Target | None) -> Outcome:
    Path(CASE_FILE).write_bytes(case.data())
    for name, data in case.files:
        Path(name).write_bytes(data)
    status, out, err = _call_main(main, ["check", CASE_FILE])
    checked = classify(status, err, out)
    if case.command == "check":
        return checked
    run_dir = f"run-{case.index}"
    destination = ["--checkpoint-to", f"s3://{s3.bucket}/case-{case.index}"] if case.s3 and s3 is not None else []
    try:
        status, out, err = _call_main(main, ["run", CASE_FILE, "--device", "cpu", "--run-dir", run_dir, *destination])
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return judge_run(checked, classify(status, err, out))


def _limit_memory() -> None:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[0])
    limit = pages * resource.getpagesize() + WORKER_MEMORY
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def serve(connection, workdir: str, s3: S3Target | None = None) -> None:
    """The worker's loop: a case in, an Outcome out, until the pipe closes."""
    os.environ.pop("SEXPGPU_DEBUG", None)  # with it set, main re-raises internal errors
    os.chdir(workdir)
    with contextlib.suppress(OSError, ValueError):
        _limit_memory()
    from sexpgpu.cli.main import main

    while True:
        try:
            case = connection.recv()
        except EOFError:
            return
        connection.send(_execute(main, case, s3))


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["sexpgpu.cli.main", "sexpgpu.cli.commands", "sexpgpu.lang.forms",
                                    "sexpgpu.run.setup", "sexpgpu.run.report", "sexpgpu.run.session",
                                    "fuzz_harness"])
    return context


class Worker:
    """One worker process and its directory; replaced after a hang or a crash."""

    def __init__(self, workdir: Path, s3: S3Target | None = None):
        self.workdir = workdir
        self.s3 = s3
        self.process = None
        self.connection = None
        self.served = 0

    def _start(self) -> None:
        context = _context()
        self.connection, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, str(self.workdir), self.s3), daemon=True)
        self.process.start()
        child.close()
        self.served = 0

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.connection.close()
        self.process = None

    def execute(self, case: Case, time_limit: float) -> Outcome:
        if self.process is None or self.served >= 500:  # a fresh worker now and then bounds memory
            self.stop()
            self._start()
        self.served += 1
        self.connection.send(case)
        if not self.connection.poll(time_limit):
            self.stop()
            return Outcome("hang", True, f"no answer within {time_limit:g} s")
        try:
            return self.connection.recv()
        except (EOFError, ConnectionResetError):
            self.process.join()
            code = self.process.exitcode
            self.stop()
            return Outcome("crash", True, f"the worker died (exit code {code})")


@dataclass(frozen=True)
class Limits:
    check_seconds: float = 45.0  # a hang detector: check is linear, but a legal graph of 2^17 nodes takes seconds on a loaded CI machine
    run_seconds: float = 90.0
    max_hangs: int = 1  # stop at the first: each costs a whole time limit, and one fails the test


@dataclass
class Failure:
    case: Case
    outcome: Outcome


@dataclass
class Summary:
    counts: dict[str, Counter] = field(default_factory=lambda: {"check": Counter(), "run": Counter()})
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    stopped_early: bool = False

    @property
    def cases(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())

    def add(self, case: Case, outcome: Outcome) -> None:
        self.counts[case.command][outcome.label] += 1
        self.cpu_seconds += outcome.cpu_seconds
        if outcome.failed:
            self.failures.append(Failure(case, outcome))

    def merge(self, other: "Summary") -> None:
        for command, counter in other.counts.items():
            self.counts[command].update(counter)
        self.failures.extend(other.failures)
        self.seconds = max(self.seconds, other.seconds)
        self.cpu_seconds += other.cpu_seconds
        self.stopped_early |= other.stopped_early

    def record(self) -> str:
        """The counts as JSON, to travel from a pytest-xdist worker in a report's properties."""
        return json.dumps({"counts": self.counts, "seconds": self.seconds, "cpu_seconds": self.cpu_seconds,
                           "stopped_early": self.stopped_early})

    @classmethod
    def from_records(cls, records) -> "Summary":
        """The sum of shards' records; `seconds` is their total (time on one core)."""
        total = cls()
        for record in map(json.loads, records):
            for command, counts in record["counts"].items():
                total.counts[command].update(counts)
            total.seconds += record["seconds"]
            total.cpu_seconds += record["cpu_seconds"]
            total.stopped_early |= record["stopped_early"]
        return total

    def hangs(self) -> int:
        return sum(c["hang"] for c in self.counts.values())

    def failure_count(self) -> int:
        return len(self.failures)

    def format(self) -> str:
        """The figures to quote: cases, each command's outcome classes, and the failures."""
        totals = {command: sum(counter.values()) for command, counter in self.counts.items()}
        stopped = ", stopped at a hang" if self.stopped_early else ""
        lines = [f"fuzz: {self.cases} cases ({totals['check']} check, {totals['run']} check+run) "
                 f"in {self.seconds:.1f} s ({self.cpu_seconds:.1f} s of the workers' CPU){stopped}"]
        for command, counter in self.counts.items():
            passed = sorted(((n, label) for label, n in counter.items() if not _is_failure(label)),
                            key=lambda item: (-item[0], item[1]))
            lines.append(f"  {command}: " + (", ".join(f"{label} {n}" for n, label in passed) or "none"))
        failed = Counter()
        for counter in self.counts.values():
            failed.update({label: n for label, n in counter.items() if _is_failure(label)})
        shown = {"internal": failed["internal"], "hang": failed["hang"], **failed}
        lines.append("  failures: " + ", ".join(f"{label} {n}" for label, n in shown.items()))
        return "\n".join(lines)


def _is_failure(label: str) -> bool:
    return label in FAILURE_LABELS or label.startswith("status-")


@contextlib.contextmanager
def worker_directory(parent: Path | None = None):
    """A scratch directory for a worker, where the examples' relative data paths resolve."""
    with tempfile.TemporaryDirectory(prefix="sexpgpu-fuzz-", dir=parent) as directory:
        (Path(directory) / "data").symlink_to(EXAMPLES / "data")
        yield Path(directory)


def fuzz(cases, limits: Limits = Limits(), workdir: Path | None = None, s3: S3Target | None = None) -> Summary:
    """Run the cases one after another in one worker and count their outcomes."""
    summary = Summary()
    started = time.monotonic()
    with worker_directory(workdir) as directory:
        worker = Worker(directory, s3)
        try:
            for case in cases:
                time_limit = limits.run_seconds if case.command == "run" else limits.check_seconds
                summary.add(case, worker.execute(case, time_limit))
                if summary.hangs() >= limits.max_hangs:
                    summary.stopped_early = True
                    break
        finally:
            worker.stop()
    summary.seconds = time.monotonic() - started
    return summary
