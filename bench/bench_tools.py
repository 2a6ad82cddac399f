"""What `sexpgpu evaluate` and `sexpgpu replay` cost against the run's own inline step time
(docs/tools.md).

    python bench/bench_tools.py [--model char-lm|tiny-adam] [--device cuda|cpu] [--steps 40] [--smoke]

In one process, through `sexpgpu.cli.main.main`:

- inline: two runs of the model, of S and S/2 steps (a checkpoint and a pass every S/2); the
  difference of their wall times over S/2 is the inline seconds a step (the longer run's one
  extra pass and checkpoint included, so a slight overestimate);
- replay: from the checkpoint at S/2, 1 step and S/2 steps; the difference over S/2 - 1 is
  replay's seconds a step, and the 1-step time less one step is its start (reading the
  checkpoint, compiling, choosing);
- evaluate: the checkpoint at S, its wall time, in inline steps.

The goal: a replayed step within 1.1x of an inline step; evaluate's and replay's starts of
the order of a run's own start. --smoke: tiny-adam, S = 4, on the CPU where there is no GPU
(bench/smoke.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
import time
from pathlib import Path

import smoke

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MODELS = {"char-lm": ROOT / "examples" / "char-lm.sexp", "tiny-adam": ROOT / "examples" / "tiny-adam.sexp"}


def variant(model: str, steps: int, every: int, folder: Path) -> Path:
    """The model's file with `steps` steps, a checkpoint and a pass every `every`."""
    text = MODELS[model].read_text()
    text = text.replace('"data/', f'"{ROOT}/examples/data/')
    text = re.sub(r":steps\s+\d+", f":steps {steps}", text)
    text = re.sub(r"\s*:checkpoint\s+\d+", "", text)
    text = re.sub(r":passes \(\((\w+) :every \d+", lambda m: f":passes (({m.group(1)} :every {every}", text)
    text = text.rstrip()[:-1] + f"\n  :checkpoint {every})\n"  # inside the defrun, the file's last form
    path = folder / f"{model}-{steps}.sexp"
    path.write_text(text)
    return path


def timed(*argv) -> float:
    from sexpgpu.cli.main import main

    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = main([str(arg) for arg in argv])
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"sexpgpu {' '.join(map(str, argv))} exited {status}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="char-lm", choices=sorted(MODELS))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=40, help="S, even (default 40)")
    smoke.add_option(parser)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.steps = "tiny-adam", 4
        if args.device == "cuda" and not smoke.gpu():
            args.device = "cpu"
            smoke.skipped("the CUDA backend (the steps run on the CPU interpreter)")
    steps, half = args.steps, args.steps // 2
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as work:
        folder = Path(work)
        long_file, short_file = variant(args.model, steps, half, folder), variant(args.model, half, half, folder)
        timed("run", long_file, "--device", args.device, "--run-dir", folder / "warm")  # compile caches, choices
        long_run = timed("run", long_file, "--device", args.device, "--run-dir", folder / "long")
        short_run = timed("run", short_file, "--device", args.device, "--run-dir", folder / "short")
        inline_step = (long_run - short_run) / half
        checkpoint = folder / "long" / f"step-{half}"
        replay_one = timed("replay", checkpoint, "--steps", 1, "--device", args.device)
        replay_all = timed("replay", checkpoint, "--steps", half, "--device", args.device)
        replay_step = (replay_all - replay_one) / max(1, half - 1)
        evaluate = timed("evaluate", folder / "long" / f"step-{steps}", "--device", args.device)
    print(f"{args.model} on {args.device}, S = {steps} steps")
    print(f"  run start          {short_run - half * inline_step:8.3f} s")
    print(f"  inline step        {inline_step * 1e3:8.2f} ms")
    print(f"  replayed step      {replay_step * 1e3:8.2f} ms   {replay_step / inline_step:6.2f}x inline")
    print(f"  replay start       {replay_one - replay_step:8.3f} s   ({half} steps replayed in {replay_all:.3f} s)")
    print(f"  evaluate           {evaluate:8.3f} s   {evaluate / inline_step:8.1f} inline steps (start included)")


if __name__ == "__main__":
    main()
