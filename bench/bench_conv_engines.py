"""What cuDNN offers for a run's convolutions on this GPU, and what the plan would choose.

    python bench/bench_conv_engines.py [FILE.sexp ...] [--all] [--smoke]

For each convolution of each file's training graph and passes (examples/cnn.sexp, and its
bf16 form, by default): its key, the engines cuDNN's frontend offers in the heuristics'
order (backends/cuda/cudnn_engines.py: deterministic, float32 arithmetic, built here), each
of the first eight timed as the plan times them (the median of five warm calls), the one the
plan would choose (the fastest, an earlier one on a tie) and the one --deterministic takes
(the first). --all times every offered engine, not only the first eight. Nothing is
remembered: ~/.cache/sexpgpu is not read or written. --smoke: the first engine of each
convolution only (bench/smoke.py); without a GPU or cuDNN's frontend, the convolutions' keys
alone.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import smoke

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def convolutions_of(path: Path, precision: str | None):
    from sexpgpu.graph import compile_program
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.backends.cuda.convolutions import graph_convolutions

    experiment = load_experiment(str(path))
    if precision is not None:
        run = replace(experiment.run, precision=precision)
        experiment = replace(experiment, runs={**experiment.runs, run.name: run})
    program = compile_program(experiment)
    keys = []
    for graph in (*program.training.graphs, *program.passes.values()):
        keys += [key for key in graph_convolutions(graph) if key not in keys]
    return keys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--all", action="store_true", help="time every offered engine")
    smoke.add_option(parser)
    args = parser.parse_args()

    from sexpgpu.backends.cuda import cudnn_engines
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.cuda.probe import CudaProbe
    from sexpgpu.plan.choices import CONVOLUTION_CANDIDATES

    runs = [(path, None) for path in args.files] or [(ROOT / "examples" / "cnn.sexp", None),
                                                     (ROOT / "examples" / "cnn.sexp", "bf16")]
    if args.smoke and (not smoke.gpu() or cudnn_engines.frontend() is None):
        smoke.skipped("offering and timing cuDNN's engines", smoke.NO_GPU if not smoke.gpu()
                      else f"no engines: {cudnn_engines.unavailable()}")
        for path, precision in runs:
            print(f"\n{path.name}{' in ' + precision if precision else ''}")
            for key in convolutions_of(path, precision):
                print(f"  {key.key()}")
        return 0
    if cudnn_engines.frontend() is None:
        print(f"no engines: {cudnn_engines.unavailable()}")
        return 1
    probe = CudaProbe(CudaBackend())
    print(f"cuDNN's frontend {cudnn_engines.frontend_version()} on {probe.device_facts().line()}")
    for path, precision in runs:
        print(f"\n{path.name}{' in ' + precision if precision else ''}")
        for key in convolutions_of(path, precision):
            offered = probe.convolution_engines(key)
            plans = cudnn_engines.plans_for(key, probe._device_index())
            print(f"  {key.key()}: {len(offered)} offered of {plans.plan_count} plans"
                  + (f" ({plans.declined})" if plans.declined else ""))
            timed = offered if args.all else offered[:1 if args.smoke else CONVOLUTION_CANDIDATES]
            seconds = {engine: probe.time_convolution(key, engine) for engine in timed}
            for index, engine in enumerate(offered):
                shown = f"{seconds[engine] * 1e6:9.1f} us" if engine in seconds else "  (not timed)"
                print(f"    {index:2d}  {shown}  {engine}")
            if timed:
                first = timed[:CONVOLUTION_CANDIDATES]
                chosen = min(range(len(first)), key=lambda index: (seconds[first[index]], index))
                print(f"    chosen: {first[chosen]}; --deterministic: {offered[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
