"""What every benchmark in bench/ shares: each row timed in a process of its own, and the
results written to bench/results/ by the script, never pasted by hand.

A row runs in a fresh process because the CUDA backend's device set-up changes torch's global
flags (deterministic algorithms on, bf16 reduced-precision reductions off, a fixed cuBLAS
workspace): a PyTorch peer timed after it in the same process is not what a user runs. The
parent process never touches the GPU; it starts each row as

    python bench/SCRIPT.py --row '{"model": ..., ...}'

and reads the one line the row prints, `bench-row: {JSON}`. A row that raises, crashes or
runs past its time is a failed row with its error, and the next row runs.

A script adopts it in four steps (bench/bench_cuda.py is the fullest example):

    parser = argparse.ArgumentParser(...)
    harness.add_options(parser)                       # --row (internal), --results DIR
    args = parser.parse_args()
    if args.row:                                      # in the row's own process
        harness.answer(time_one_row, args.row)        # time_one_row(spec: dict) -> dict
        return
    done = harness.run_rows(__file__, [harness.Row("tiny-adam/interpreter", {...}), ...])
    folder = harness.results_folder(args.results, args.smoke)
    harness.write_results(harness.Report("bench_x-tiny-adam", ...), folder, smoke=args.smoke)

Results: bench/results/NAME.json (every row's record, the machine, the versions, the date,
the command; the versions name this tree by its git commit, or by BENCH_REVISION where the
tree is a copy without git, and by a digest of its Python sources) and NAME.md (the same as a table), one pair per report; a later run of the same
report replaces it. A smoke run writes to a temporary folder instead (its figures mean nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MARK = "bench-row: "  # starts the line that carries a row's record
ROW_TIMEOUT = 480.0  # seconds: a compiled gpt-124m row takes about two minutes on an H200
PACKAGES = ("torch", "triton", "numpy")


@dataclass(frozen=True)
class Row:
    """One row to time: its name, the spec its process is given, and the environment it runs
    in beyond the parent's (a value of None removes the variable)."""

    name: str
    spec: dict
    environment: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RowResult:
    name: str
    wall_seconds: float  # of its whole process: start, compilation, timing
    found: dict  # what the row returned; empty when it failed
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--row", help=argparse.SUPPRESS)  # the spec of the one row this process times
    parser.add_argument("--results", type=Path, default=None,
                        help=f"where to write the results (default {RESULTS.relative_to(ROOT)}/; "
                             "--smoke: a temporary folder)")
    parser.add_argument("--row-timeout", type=float, default=ROW_TIMEOUT,
                        help=f"seconds a row's process may take before it counts as failed (default {ROW_TIMEOUT:.0f})")


def answer(time_row: Callable[[dict], dict], spec_text: str) -> None:
    """In a row's process: time the row and print its record, or its error, on one line."""
    try:
        found = time_row(json.loads(spec_text))
    except Exception as error:  # noqa: BLE001 - reported to the parent as the row's failure
        traceback.print_exc()
        print(MARK + json.dumps({"error": one_line(error)}), flush=True)
        raise SystemExit(1) from None
    print(MARK + json.dumps(found, default=str), flush=True)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def run_rows(script: str | Path, rows: list[Row], timeout: float = ROW_TIMEOUT) -> list[RowResult]:
    """Each row in a fresh process of `script`, one after another, with progress printed."""
    results = []
    for number, row in enumerate(rows, 1):
        print(f"[{number}/{len(rows)}] {row.name} ...", flush=True)
        result = run_row(Path(script), row, timeout)
        status = "done" if result.ok else f"FAILED: {result.error}"
        print(f"[{number}/{len(rows)}] {row.name}: {status} ({result.wall_seconds:.1f} s)", flush=True)
        results.append(result)
    return results


def run_row(script: Path, row: Row, timeout: float) -> RowResult:
    environment = {**os.environ}
    for name, value in row.environment.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, str(script), "--row", json.dumps(row.spec)], env=environment,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return RowResult(row.name, time.perf_counter() - started, {}, f"ran past {timeout:.0f} s")
    seconds = time.perf_counter() - started
    records = [line[len(MARK):] for line in done.stdout.splitlines() if line.startswith(MARK)]
    for line in done.stdout.splitlines():  # what the row says besides its record (smoke: skipped ...)
        if not line.startswith(MARK):
            print(f"    {line}", flush=True)
    if not records:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return RowResult(row.name, seconds, {}, f"no record (exit status {done.returncode}): {last}")
    found = json.loads(records[-1])
    if "error" in found:
        return RowResult(row.name, seconds, {}, found["error"])
    return RowResult(row.name, seconds, found)


@dataclass(frozen=True)
class Report:
    """What a script writes for one group of rows: `name` names the files; `columns` and
    `table` are the Markdown table; `lines` follow it (the ratios, where the time goes);
    `settings` are the figures' conditions (steps, warm-up)."""

    name: str
    title: str
    rows: list[RowResult]
    columns: list[str]
    table: list[list]
    lines: list[str] = field(default_factory=list)
    settings: dict = field(default_factory=dict)


def results_folder(results: Path | None, smoke: bool) -> Path:
    """Where a run writes: --results, else bench/results/, or for a smoke run a temporary folder."""
    if results is not None:
        return results
    return Path(tempfile.mkdtemp(prefix="bench-smoke-results-")) if smoke else RESULTS


def write_results(report: Report, directory: Path, smoke: bool = False) -> Path:
    """`directory`/NAME.json and NAME.md; the JSON file's path. A smoke run with a failed row
    exits with an error after writing: a smoke run is there to fail when the script is broken."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": report.name, "title": report.title, "command": command_line(), "date": now(),
              "machine": machine(), "versions": versions(), "settings": report.settings,
              "rows": [asdict(row) for row in report.rows], "summary": report.lines}
    path = directory / f"{report.name}.json"
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    (directory / f"{report.name}.md").write_text(markdown(report, record))
    print(f"results: {path} and {path.with_suffix('.md').name}", flush=True)
    failed = [row.name for row in report.rows if not row.ok]
    if smoke and failed:
        raise SystemExit(f"smoke run: rows failed: {', '.join(failed)}")
    return path


def markdown(report: Report, record: dict) -> str:
    machine_facts, version_facts = record["machine"], record["versions"]
    settings = ", ".join(f"{key} {value}" for key, value in report.settings.items())
    lines = [f"# {report.title}", "",
             f"Written by `{record['command']}` on {record['date']}; do not edit by hand.", "",
             f"- machine: {machine_facts['gpu']}; {machine_facts['cpu']}, {machine_facts['cores']} cores",
             "- versions: " + ", ".join(f"{name} {value}" for name, value in version_facts.items()),
             *([f"- settings: {settings}"] if settings else []), "",
             "| " + " | ".join(report.columns) + " |", "|" + "---|" * len(report.columns),
             *("| " + " | ".join(str(cell) for cell in cells) + " |" for cells in report.table), ""]
    lines += [f"- {line}" for line in report.lines]
    lines += [f"- {row.name} failed: {row.error}" for row in report.rows if not row.ok]
    return "\n".join(lines).rstrip() + "\n"


def command_line() -> str:
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return " ".join(["python", str(shown), *sys.argv[1:]])


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def machine() -> dict:
    return {"gpu": gpu_name(), "cpu": cpu_name(), "cores": os.cpu_count(), "system": platform.platform()}


def gpu_name() -> str:
    """Asked of nvidia-smi: the parent process never initialises CUDA, its rows do."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "no GPU"
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not names:
        return "no GPU"
    count = f"{len(names)} x " if len(names) > 1 else ""
    name, _, driver = names[0].partition(",")
    return f"{count}{name.strip()} (driver {driver.strip()})"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    found["sexpgpu"] = git_revision()
    found["sources"] = source_digest()
    return found


def source_digest() -> str:
    """SHA-256 (first 16 hex digits) over src/ and bench/'s Python files, path and text:
    names the code measured where the tree is a copy without git (a device machine's)."""
    digest = hashlib.sha256()
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "bench").glob("*.py")]):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def git_revision() -> str:
    """The tree's commit, and whether it had uncommitted changes (bench/results/ aside).
    BENCH_REVISION, where set, wins: a device machine's copy of the tree may carry a git
    folder whose HEAD is not the commit copied."""
    if os.environ.get("BENCH_REVISION"):
        return os.environ["BENCH_REVISION"]

    def git(*argv):
        return subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        status = git("status", "--porcelain", "--", ".", ":!bench/results")
    except (OSError, subprocess.TimeoutExpired):
        head = subprocess.CompletedProcess([], 1)
    if head.returncode != 0:  # a copy of the tree without git
        return "unknown (no git here; BENCH_REVISION names the commit)"
    return head.stdout.strip() + (" with uncommitted changes" if status.stdout.strip() else "")


def torch_flags() -> dict:
    """The global settings of torch that decide which kernels a step gets, as they are in this
    process: a row records them, so that a peer's record shows it ran with PyTorch's defaults."""
    import torch

    matmul = torch.backends.cuda.matmul
    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "matmul_tf32": matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
