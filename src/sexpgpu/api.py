"""The Python API: what `sexpgpu run`, `checkpoint` and `diff` do, as calls (docs/api.md).

`train` is `sexpgpu run`: the name `sexpgpu.run` is the run stage's package.

Each call is the command's own code under it (run/session.py, store/, tools/comparing.py),
with the command's checks before it: the environment's SEXPGPU_* settings are checked first
(an unknown name is a warning), and bad input of any kind raises a SexpgpuError with the code
the command would exit with. Importing this module, and so `import sexpgpu`, imports neither
numpy nor torch: each call imports what it needs.
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sexpgpu import settings
from sexpgpu.errors import SexpgpuError


@dataclass(frozen=True)
class RunResult:
    """A finished (or stopped) run, as its run directory records it."""

    run_dir: Path
    step: int  # the last step trained
    metrics: tuple[dict, ...]  # one record a step, as metrics.jsonl holds it: loss, loss_bits, lr, grad_norm, digest
    evaluations: tuple[dict, ...]  # each step's evaluation records merged: {"step": n, "eval/loss": ..., ...}
    digest: str | None  # the parameters' digest after the last step trained (None when none was)
    checkpoints: dict[int, str]  # {step: path or s3:// URI} of every committed checkpoint, oldest first
    determinism: str  # the report's determinism line
    choices: dict  # the machine's choices in effect (experiment.json's)
    stopped_by: str | None = None  # "Ctrl-C" or "SIGTERM" when the run stopped before its last step


def train(file, selection: str | None = None, *, device: str = "auto", run_dir=None, resume: str | None = None,
          checkpoint_to: str | None = None, choices: str | None = None, deterministic: bool = False) -> RunResult:
    """Train a defrun as `sexpgpu run FILE [SELECTION]` with these flags does: the report goes
    to stdout, the progress to stderr, and the run directory gets its files."""
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.session import RunOptions, execute

    with _as_a_command("while sexpgpu.train ran"):
        experiment = load_experiment(file, selection)
        options = RunOptions.from_flags(device, choices, deterministic, run_dir=_optional_path(run_dir),
                                        resume=_optional_path(resume), checkpoint_to=_optional_path(checkpoint_to))
        outcome = execute(experiment, options)
        return _result(outcome)


def open_checkpoint(path, framework: str = "numpy") -> dict:
    """{name: tensor} of a committed checkpoint (a step-<n> directory or an s3:// prefix), as
    `sexpgpu checkpoint PATH --verify` reads it: every file checked against its SHA-256.
    Parameters are named `param/<path>`, optimizer state `state/<slot>/<path>`. numpy gives a
    tensor stored as BF16 as the float32 array of the same values; torch as bfloat16."""
    from sexpgpu.store import read_checkpoint

    convert = _converter(framework)
    with _as_a_command("while sexpgpu.open_checkpoint ran"):
        checkpoint = read_checkpoint(os.fspath(path))
        return {name: convert(array, checkpoint.stored_dtypes[name]) for name, array in checkpoint.tensors.items()}


def compare(run_a, run_b):
    """Where two runs part, as `sexpgpu diff RUN_A RUN_B` says it: a `Diff` whose `identical`
    is the command's exit status 0. A run is a RunResult, a run directory or its metrics.jsonl."""
    from sexpgpu.tools.comparing import diff_runs, read_run

    with _as_a_command("while sexpgpu.compare ran"):
        return diff_runs(read_run(_run_path(run_a)), read_run(_run_path(run_b)))


@contextmanager
def _as_a_command(doing: str):
    """What the command line does around every command: the environment's settings checked
    first (E-CONFIG-001), and a host allocation that fails given as E-MEM-003."""
    from sexpgpu.run.allocation import allocation_failed_on_host

    for warning in settings.check_environment():
        warnings.warn(warning.removeprefix("warning: "), stacklevel=3)
    try:
        yield
    except MemoryError as error:
        raise allocation_failed_on_host(error, doing) from None


def _result(outcome) -> RunResult:
    """The RunResult of an executed run, read back from the run directory it wrote."""
    from sexpgpu.tools.comparing import read_run

    records = read_run(outcome.run_dir)
    metrics = tuple(records.steps[step] for step in sorted(records.steps))
    with open(os.path.join(outcome.run_dir, "lowering.json"), encoding="utf-8") as handle:
        determinism = json.load(handle)["metadata"]["determinism"]
    return RunResult(run_dir=Path(outcome.run_dir), step=outcome.final_step, metrics=metrics,
                     evaluations=tuple(records.evaluations[step] for step in sorted(records.evaluations)),
                     digest=metrics[-1]["digest"] if metrics else None, checkpoints=records.checkpoints,
                     determinism=determinism, choices=records.record.get("choices", {}),
                     stopped_by=outcome.stop.name if outcome.stop else None)


def _converter(framework: str):
    if framework not in FRAMEWORKS:
        raise SexpgpuError("E-API-001", f"framework {framework!r} is not one open_checkpoint gives tensors as: "
                                        f"expected one of {', '.join(FRAMEWORKS)}.")
    return FRAMEWORKS[framework]


def _as_numpy(array, stored: str):
    return array


def _as_torch(array, stored: str):
    try:
        import torch
    except ImportError:
        raise SexpgpuError("E-API-002", "open_checkpoint(..., framework='torch') gives torch tensors, and torch is "
                                        "not installed.",
                           hint="Install the optional extra torch (pip install 'sexpgpu[torch]'), or take numpy "
                                "arrays.") from None
    tensor = torch.from_numpy(array)
    # a BF16 tensor is held as float32 with its low 16 bits zero, so the cast back keeps every bit
    return tensor.to(torch.bfloat16) if stored == "BF16" else tensor


FRAMEWORKS = {"numpy": _as_numpy, "torch": _as_torch}  # what open_checkpoint gives tensors as


def _run_path(run) -> str:
    return os.fspath(run.run_dir if isinstance(run, RunResult) else run)


def _optional_path(path) -> str | None:
    """A path as the run stage takes it: a str (an s3:// URI too), from a str or a PathLike."""
    return None if path is None else os.fspath(path)
