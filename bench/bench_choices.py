"""What the machine's choices cost and buy on one GPU (determinism.md, "What a run chooses").

    python bench/bench_choices.py [--steps N] [--models char-lm,gpt-50m] [--micro-batch quarter|file]
                                  [--results DIR] [--smoke]

For char-lm and bench/gpt-50m.sexp, each with :microbatches 4 (by default each microbatch a
quarter of the file's :batch, so a step sees the file's batch), the choices made as `sexpgpu
run` makes them (run/choosing.py's `choose`, plan/choices.py's rules), each row in a process
of its own with an empty ~/.cache/sexpgpu (bench/harness.py):

- `default`: the default's choices and step. The cost of measuring: the first step's
  `choose` (every stacking degree that fits, every float32 product's implementations, the
  flops and the bandwidth), in seconds and in unstacked steps, and the same call again,
  answered from the cache;
- `deterministic`: --deterministic's choices (stacking 1, ordinary products, 9 flops a byte)
  and step: the goal is deterministic/default at most 1.05;
- `stacking-2`, `stacking-4`: --deterministic's products and budget at each stacking degree
  that divides 4, as ratios to the unstacked step; the one at the default's degree splits the
  gap between the stacking and the rest. On a GPU, that row and `deterministic` also profile
  their step's microbatch calls by kind of launch (products, attention, ...): where the
  stacking's gain lies.

A row that fails (out of memory, say) is reported with its error and the next one runs.
Written: bench/results/bench_choices-MODEL.json and .md. --smoke: char-lm cut to
milliseconds a step, one timed step (bench/smoke.py); without a GPU the CPU interpreter
stands in for the CUDA backend, so only the lines' shape means anything.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import smoke

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MODELS = {"char-lm": ROOT / "examples" / "char-lm.sexp", "gpt-50m": ROOT / "bench" / "gpt-50m.sexp"}
MICROBATCHES = 4


def experiment_of(path: Path, micro_batch: str, edits: dict | None = None):
    from sexpgpu.lang.forms import parse_experiment, select_run
    from sexpgpu.lang.reader import read_text

    text = path.read_text()
    for old, new in (edits or {}).items():
        text = text.replace(old, new)
    batch = int(re.search(r":batch (\d+)", text).group(1))
    per_micro = max(1, batch // MICROBATCHES) if micro_batch == "quarter" else batch
    text = re.sub(r":batch \d+", f":batch {per_micro} :microbatches {MICROBATCHES}", text, count=1)
    return select_run(parse_experiment(read_text(text, str(path)), str(path), ""), None), per_micro


class Run:
    """A run's program on the CUDA backend, its choices made by `choose`, stepped by the run loop."""

    def __init__(self, experiment, device: str = "cuda"):
        from sexpgpu.run.setup import build_run

        self.experiment, self.device = experiment, device
        self.built = build_run(experiment, device)
        self.state = self.built.initial_state()

    def choose(self, **settings):
        """(Chosen, seconds): the choices as `sexpgpu run` makes them, handed to the backend."""
        from sexpgpu.run.choosing import ChoiceSettings, choose
        from sexpgpu.run.loop import Trainer

        first = Trainer(self.experiment.run, self.built.program, self.built.backend, self.built.feeder)
        start = time.perf_counter()
        chosen = choose(self.built, ChoiceSettings(**settings), None, lambda: first.first_inputs(self.state))
        seconds = time.perf_counter() - start
        self.built.backend.take_choices(chosen.choices)
        return chosen, seconds

    def step_seconds(self, degree: int, steps: int, warmup: int) -> tuple[float, dict]:
        """(the median step's seconds, {kind of launch: seconds} of one step's microbatch calls,
        profiled one call at the stacking degree; empty on the CPU interpreter)."""
        from sexpgpu.graph.training.stacking import stack_training
        from sexpgpu.run.loop import Stacking, Trainer

        stacking = Stacking(stack_training(self.built.program.training, degree), degree)
        trainer = Trainer(self.experiment.run, self.built.program, self.built.backend, self.built.feeder, stacking)
        for _ in range(warmup):
            trainer.step(self.state)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            trainer.step(self.state)  # returns the step's loss: it waits for the GPU
            times.append(time.perf_counter() - start)
        profile = {}
        if self.device == "cuda":
            calls = MICROBATCHES // degree
            one = self.built.backend.profile(stacking.training.micro, trainer.call_inputs(self.state))
            profile = {kind: seconds * calls for kind, seconds in one.items()}
        return statistics.median(times), profile


def empty_cache_home():
    """A HOME of its own, so the first `choose` finds nothing remembered and the user's cache is untouched."""
    home = tempfile.mkdtemp(prefix="bench-choices-home-")
    os.environ["HOME"] = home
    return home


DEFAULT = "default"
DETERMINISTIC = "deterministic"  # stacking 1, ordinary products, 9 flops a byte


def stacked(degree: int) -> str:
    """The row of --deterministic's products and budget at a stacking degree above 1."""
    return f"stacking-{degree}"


def degrees() -> list[int]:
    return [degree for degree in range(1, MICROBATCHES + 1) if MICROBATCHES % degree == 0]


def time_row(spec: dict) -> dict:
    """In a row's own process, with a HOME of its own (nothing remembered): the default's
    choices and step, or --deterministic's choices and the step at one stacking degree."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"  # the parent allows the CPU in a smoke run only
    edits = smoke.TINY_CHAR_LM if spec["smoke"] else None
    experiment, _ = experiment_of(MODELS[spec["model"]], spec["micro_batch"], edits)
    empty_cache_home()
    run = Run(experiment, device)
    if spec["row"] != DEFAULT:
        run.choose(deterministic=True)
        seconds, profile = run.step_seconds(spec["degree"], spec["steps"], spec["warmup"])
        return {"seconds": seconds, "profile": profile}
    chosen, measuring = run.choose()
    choices = chosen.choices
    seconds, _ = run.step_seconds(choices.stacking, spec["steps"], spec["warmup"])
    # the second choose finds every choice in the cache; after the steps, no kernel is new to it
    _, remembered = run.choose()
    return {"seconds": seconds, "measuring": measuring, "remembered": remembered, "report": chosen.report_lines(),
            "degree": choices.stacking, "products": len(choices.products or {}),
            "not_ordinary": sum(1 for kind in (choices.products or {}).values() if kind != "ordinary"),
            "recompute": choices.recompute}


def planned_rows(name: str, options) -> list[harness.Row]:
    spec = {"model": name, "micro_batch": options.micro_batch, "steps": options.steps, "warmup": options.warmup,
            "smoke": options.smoke}
    rows = [harness.Row(f"{name}/{DEFAULT}", {**spec, "row": DEFAULT})]
    for degree in degrees():
        row = DETERMINISTIC if degree == 1 else stacked(degree)
        rows.append(harness.Row(f"{name}/{row}", {**spec, "row": row, "degree": degree}))
    return rows


def report(name: str, per_micro: int, results: dict, options) -> harness.Report:
    """The lines and table of one model; `results` by row."""
    print(f"\n{name}: :batch {per_micro} :microbatches {MICROBATCHES}, each row in its own process", flush=True)
    default, strict = results[DEFAULT], results[DETERMINISTIC]
    lines = [f"{row} failed: {result.error}" for row, result in results.items() if not result.ok]
    if default.ok:
        for label, text in default.found["report"]:
            print(f"  {label:12s}{text}")
    if default.ok and strict.ok:
        lines += comparison(default.found, strict.found["seconds"], results)
    for line in lines:
        print(f"  {line}")
    table = [[row, f"{result.found['seconds'] * 1e3:.2f}" if result.ok else "failed",
              f"{strict.found['seconds'] / result.found['seconds']:.2f}" if result.ok and strict.ok else ""]
             for row, result in results.items()]
    settings = {"steps": options.steps, "warm-up": options.warmup, "batch": per_micro, "microbatches": MICROBATCHES}
    return harness.Report(f"bench_choices-{name}", f"bench_choices: {name}", list(results.values()),
                          ["row", "ms a step (median)", "deterministic/row"], table, lines, settings)


def comparison(default: dict, unstacked: float, results: dict) -> list[str]:
    """The lines that compare the default with --deterministic and the stacking degrees."""
    step, degree = default["seconds"], default["degree"]
    lines = [f"measuring at the first step: {default['measuring']:.2f} s = {default['measuring'] / unstacked:.1f} "
             f"unstacked steps; again from the cache: {default['remembered'] * 1e3:.1f} ms"]
    for row, result in results.items():
        if row != DEFAULT and result.ok:
            lines.append(f"{row} (--deterministic's products and budget): {result.found['seconds'] * 1e3:8.2f} ms a "
                         f"step   unstacked/stacked {unstacked / result.found['seconds']:5.2f}")
    lines.append(f"default: stacking {degree}, {default['not_ordinary']} of {default['products']} products not "
                 f"ordinary, {budget_text(default['recompute'])}: {step * 1e3:.2f} ms a step")
    lines.append(f"--deterministic (stacking 1, ordinary, 9.00): {unstacked * 1e3:.2f} ms a step   "
                 f"deterministic/default {unstacked / step:5.2f} (goal at most 1.05)")
    at_degree = results.get(DETERMINISTIC if degree == 1 else stacked(degree))
    if at_degree is not None and at_degree.ok:
        lines.append(f"  of which stacking: {unstacked / at_degree.found['seconds']:5.2f}; the products and the "
                     f"budget: {at_degree.found['seconds'] / step:5.2f}")
        lines += stacking_by_kind(results[DETERMINISTIC].found["profile"], at_degree.found["profile"], degree)
    return lines


def stacking_by_kind(unstacked: dict, stacked_: dict, degree: int) -> list[str]:
    """Where stacking's gain lies: each kind of launch's milliseconds in a step's microbatch
    calls, profiled, unstacked against stacked at `degree` (none on the CPU interpreter)."""
    if not unstacked or not stacked_ or degree == 1:
        return []
    kinds = sorted(set(unstacked) | set(stacked_), key=lambda kind: stacked_.get(kind, 0.0) - unstacked.get(kind, 0.0))
    parts = ", ".join(f"{kind} {unstacked.get(kind, 0.0) * 1e3:.2f} against {stacked_.get(kind, 0.0) * 1e3:.2f}"
                      for kind in kinds)
    total = sum(unstacked.values()) * 1e3, sum(stacked_.values()) * 1e3
    return [f"  profiled microbatch calls of a step, unstacked against stacking {degree}: {total[0]:.2f} against "
            f"{total[1]:.2f} ms; by kind, ms: {parts}"]


def budget_text(recompute: float | None) -> str:
    """The recompute budget a backend took (the CPU interpreter takes none)."""
    return "no recompute budget" if recompute is None else f"{recompute:.2f} flops a byte"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--micro-batch", choices=("quarter", "file"), default="quarter",
                        help="each microbatch a quarter of the file's :batch (a step sees the file's batch), or all of it")
    harness.add_options(parser)
    smoke.add_option(parser)
    options = parser.parse_args()
    if options.row:
        harness.answer(time_row, options.row)
        return
    if options.smoke:
        options.models, options.steps, options.warmup = "char-lm", 1, 0
        if not smoke.gpu():
            smoke.skipped("the CUDA backend (the CPU interpreter makes and times the choices instead)")
    elif not smoke.gpu():
        print("bench_choices: no CUDA GPU here; it times the CUDA backend's choices and needs one")
        return
    print(f"bench_choices: {options.steps} timed steps after {options.warmup}")
    folder = harness.results_folder(options.results, options.smoke)
    for name in options.models.split(","):
        rows = planned_rows(name, options)
        done = dict(zip([row.spec["row"] for row in rows], harness.run_rows(__file__, rows, options.row_timeout)))
        _, per_micro = experiment_of(MODELS[name], options.micro_batch, smoke.TINY_CHAR_LM if options.smoke else None)
        harness.write_results(report(name, per_micro, done, options), folder, options.smoke)


if __name__ == "__main__":
    main()
