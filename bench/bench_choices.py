"""What the machine's choices cost and buy on one GPU (determinism.md, "What a run chooses").

    python bench/bench_choices.py [--steps N] [--models char-lm,gpt-50m] [--micro-batch quarter|file] [--smoke]

For char-lm and bench/gpt-50m.sexp, each with :microbatches 4 (by default each microbatch a
quarter of the file's :batch, so a step sees the file's batch), in one process, the choices
made as `sexpgpu run` makes them (run/choosing.py's `choose`, plan/choices.py's rules):

- the cost of measuring: the first step's `choose` with an empty ~/.cache/sexpgpu (every
  stacking degree that fits, every float32 product's implementations, the flops and the
  bandwidth), in seconds and in steps, and the same call again, answered from the cache;
- the step unstacked (degree 1) and at each stacking degree that divides 4, as ratios;
- the default (the choices made above) against --deterministic (stacking 1, ordinary
  products, 9 flops a byte): the goal is within 5%. The default's step is also timed at its
  degree with --deterministic's products and budget, which splits the gap between the
  stacking and the rest.

A model that fails (out of memory, say) is reported and the next one runs. --smoke: char-lm
cut to milliseconds a step, one timed step (bench/smoke.py); without a GPU the CPU interpreter
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
import traceback
from pathlib import Path

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

        self.experiment = experiment
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

    def step_seconds(self, degree: int, steps: int, warmup: int) -> float:
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
        return statistics.median(times)


def empty_cache_home():
    """A HOME of its own, so the first `choose` finds nothing remembered and the user's cache is untouched."""
    home = tempfile.mkdtemp(prefix="bench-choices-home-")
    os.environ["HOME"] = home
    return home


def bench_model(name: str, path: Path, options) -> None:
    experiment, per_micro = experiment_of(path, options.micro_batch, smoke.TINY_CHAR_LM if options.smoke else None)
    print(f"\n{name}: :batch {per_micro} :microbatches {MICROBATCHES}", flush=True)
    empty_cache_home()
    default = Run(experiment, options.device)
    chosen, measuring = default.choose()
    for label, text in chosen.report_lines():
        print(f"  {label:12s}{text}")
    degree = chosen.choices.stacking
    changed = sum(1 for implementation in (chosen.choices.products or {}).values() if implementation != "ordinary")
    default_step = default.step_seconds(degree, options.steps, options.warmup)
    # the second choose finds every choice in the cache; after the steps, no kernel is new to it
    _, remembered = default.choose()

    strict = Run(experiment, options.device)
    strict.choose(deterministic=True)
    times = {}
    for each in (d for d in range(1, MICROBATCHES + 1) if MICROBATCHES % d == 0):
        try:
            times[each] = strict.step_seconds(each, options.steps, options.warmup)
        except Exception as error:  # noqa: BLE001 - a degree that does not fit or stack is reported
            print(f"  stacking {each}: {type(error).__name__}: {str(error).splitlines()[0]}")
    unstacked = times[1]
    print(f"  measuring at the first step: {measuring:.2f} s = {measuring / unstacked:.1f} unstacked steps; "
          f"again from the cache: {remembered * 1e3:.1f} ms")
    for each, seconds in times.items():
        print(f"  stacking {each} (--deterministic's products and budget): {seconds * 1e3:8.2f} ms a step   "
              f"unstacked/stacked {unstacked / seconds:5.2f}")
    print(f"  default: stacking {degree}, {changed} of {len(chosen.choices.products or {})} products not ordinary, "
          f"{budget_text(chosen.choices.recompute)}: {default_step * 1e3:.2f} ms a step")
    print(f"  --deterministic (stacking 1, ordinary, 9.00): {unstacked * 1e3:.2f} ms a step   "
          f"deterministic/default {unstacked / default_step:5.2f} (goal at most 1.05)")
    if degree in times:
        print(f"    of which stacking: {unstacked / times[degree]:5.2f}; the products and the budget: "
              f"{times[degree] / default_step:5.2f}")


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
    smoke.add_option(parser)
    options = parser.parse_args()
    import torch

    options.device = "cuda"
    if options.smoke:
        options.models, options.steps, options.warmup = "char-lm", 1, 0
        if not torch.cuda.is_available():
            options.device = "cpu"
            smoke.skipped("the CUDA backend (the CPU interpreter makes and times the choices instead)")
    elif not torch.cuda.is_available():
        print("bench_choices: no CUDA GPU here; it times the CUDA backend's choices and needs one")
        return
    where = torch.cuda.get_device_name() if options.device == "cuda" else "the CPU"
    print(f"bench_choices on {where}: {options.steps} timed steps after {options.warmup}")
    for name in options.models.split(","):
        try:
            bench_model(name, MODELS[name], options)
        except Exception:  # noqa: BLE001 - one model's failure must not hide the other's figures
            if options.smoke:
                raise  # a smoke run is there to fail when the script is broken
            print(f"{name}: failed")
            traceback.print_exc()


if __name__ == "__main__":
    main()
