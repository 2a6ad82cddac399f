"""`sexpgpu plot` (docs/tools.md): the loss and eval curves of runs on shared axes, and for
two runs their per-step relative difference on a log scale, the first differing step marked.
matplotlib is an optional extra (`pip install 'sexpgpu[plot]'`), imported only here, when a
plot is asked for."""

from __future__ import annotations

import os

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.tools.comparing import read_run

FLOOR = 1e-12  # where an exact agreement is drawn on the log scale
SIZE_INCHES = (9.0, 6.0)
DPI = 100


def plot_runs(paths, output: str) -> str:
    """Draw the runs at `paths` into the PNG `output`; returns its path."""
    if not str(output).lower().endswith(".png"):
        raise SexpgpuError("E-DIFF-004", f"-o {output}: sexpgpu plot writes a PNG, so the file's name ends in .png.",
                           hint="Name the file FILE.png.")
    runs = [read_run(path) for path in paths]
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(2 if len(runs) == 2 else 1, 1, figsize=SIZE_INCHES, squeeze=False, sharex=True)
    _curves(axes[0][0], runs)
    if len(runs) == 2:
        _relative_difference(axes[1][0], *runs)
    axes[-1][0].set_xlabel("step")
    figure.tight_layout()
    try:
        figure.savefig(output, dpi=DPI)
    except OSError as error:
        raise SexpgpuError("E-DIFF-004", f"cannot write the plot to {output}: {error.strerror or error}.") from None
    finally:
        pyplot.close(figure)
    return os.fspath(output)


def _pyplot():
    pyplot = optional_pyplot()
    if pyplot is None:
        raise SexpgpuError("E-DIFF-003", "sexpgpu plot draws with matplotlib, which is not installed.",
                           hint="Install the optional extra: pip install 'sexpgpu[plot]'.")
    return pyplot


def optional_pyplot():
    """matplotlib's pyplot drawing into files, or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # a file, never a window
    from matplotlib import pyplot

    return pyplot


def relative_difference(left, right) -> np.ndarray:
    """|a - b| / max(|a|, |b|) per step (0 where both are 0), at least FLOOR: what a log scale
    can draw, exact agreement at FLOOR."""
    left, right = np.asarray(left, dtype=np.float64), np.asarray(right, dtype=np.float64)
    scale = np.maximum(np.abs(left), np.abs(right))
    relative = np.where(scale > 0, np.abs(left - right) / np.where(scale > 0, scale, 1), 0.0)
    return np.maximum(relative, FLOOR)


def _curves(axes, runs) -> None:
    for run in runs:
        steps = sorted(run.steps)
        (line,) = axes.plot(steps, [run.steps[step]["loss"] for step in steps], label=f"{run.source}: loss")
        keys = sorted({key for record in run.evaluations.values() for key in record if key.startswith("eval/")})
        for key in keys:
            at = sorted(step for step, record in run.evaluations.items() if key in record)
            axes.plot(at, [run.evaluations[step][key] for step in at], marker="o", linestyle="--",
                      label=f"{run.source}: {key}")
    axes.set_ylabel("value")
    axes.legend(fontsize="small")


def _relative_difference(axes, a, b) -> None:
    steps = sorted(set(a.steps) & set(b.steps))
    relative = relative_difference([a.steps[step]["loss"] for step in steps], [b.steps[step]["loss"] for step in steps])
    axes.semilogy(steps, relative, label="|loss a - loss b| / max(|a|, |b|)")
    differing = [step for step in steps if a.steps[step].get("loss_bits") != b.steps[step].get("loss_bits")
                 or a.steps[step].get("digest") != b.steps[step].get("digest")]
    if differing:
        axes.axvline(differing[0], color="red", linestyle=":", label=f"first differing step {differing[0]}")
    axes.set_ylabel("relative difference")
    axes.set_ylim(bottom=FLOOR / 10)
    axes.legend(fontsize="small")
