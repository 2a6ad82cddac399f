"""`:arithmetic exact` on the GPU against the default float32 step, on a GPT-style model.

    PYTHONPATH=src python3 bench/bench_exact_mode.py [--model gpt-50m|gpt-small] [--steps N] [--seconds S] [--counts]
                                                     [--results DIR] [--smoke]

Both steps are the run loop's (run/loop.py: the microbatches, the update, the loss read back,
the parameters' digest) on the CUDA backend, each in a process of its own (bench/harness.py):
the experiment as written, in
float32 with the backend's default lowering (ordinary cuBLAS products with TF32 off, fused
kernels, CUDA graphs), and the same experiment with `:arithmetic exact` (every sum exact and
rounded once; backends/cuda/exact.py). Each takes WARMUP steps (compilation, capture), then
timed steps until N of them or S seconds of them, whichever comes first (at least one).

The exact run stacks its microbatches as a run on the GPU does (plan/choices.py's
exact_stacking); the float32 run is unstacked, as its run chooses for one microbatch.

Printed: each step's time, the ratio exact / float32 against the goal (at most 2), and where
each step's time goes: its phases (the microbatch calls, the gradients added across calls and
rounded, the update call, the rest: the loss read back, the digest), and one profiled
microbatch by kind of step (exact-matmul, exact-sum, exact-region, elementwise, ...). With
`--counts`, also the host synchronisations and launches of one more exact step, by phase
(bench/exact_counts.py), in this process after the rows. Written:
bench/results/bench_exact_mode-MODEL.json and .md. `gpt-50m` is bench/gpt-50m.sexp; `gpt-small`
is bench/gpt-small.sexp (4 layers, width 256, context 256, batch 16, vocabulary 8192), for
when gpt-50m's exact step is too slow to time in a minute. One invocation takes at most a
few minutes on an H200 when an exact step takes less than --seconds.

--smoke: bench/exact_counts.py's mlp-tiny, one warm-up step and one timed step of each
(bench/smoke.py); without a GPU on the CPU interpreter, which neither captures nor profiles,
so only the lines' shape means anything.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import harness
import smoke

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"gpt-50m": ROOT / "bench" / "gpt-50m.sexp", "gpt-small": ROOT / "bench" / "gpt-small.sexp"}
ARITHMETICS = ("float", "exact")
WARMUP = {"float": 2, "exact": 3}  # graphs captured at the second step, exact's gradients' rounding at the third
SMOKE_MODEL = "mlp-tiny"  # of bench/exact_counts.py
GOAL = 2.0  # exact / float32, at most


@dataclass(frozen=True)
class Timed:
    seconds: float  # per timed step
    steps: int
    first: float  # the warm-up steps, compilation included
    loss: float  # the first step's
    phases: dict  # {phase of a step: seconds}, of one more step
    profile: dict  # {kind of step: seconds} of one microbatch
    captured: dict  # {"microbatch", "update" (, "gradients' rounding"): whether its calls replay a CUDA graph}
    warmup: int  # steps before the timed ones


def training(path: Path, arithmetic: str, device: str = "cuda", experiment=None):
    """(trainer, state, built) for the experiment (the file's, unless given) with `:arithmetic`
    set, on the CUDA backend (or, in a smoke run without a GPU, the CPU interpreter)."""
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.plan.choices import exact_stacking
    from sexpgpu.run.choosing import stacked_training
    from sexpgpu.run.loop import Stacking, Trainer
    from sexpgpu.run.setup import build_run

    experiment = experiment or load_experiment(str(path))
    run = replace(experiment.run, arithmetic=arithmetic)
    experiment = replace(experiment, runs={**experiment.runs, run.name: run})
    built = build_run(experiment, device)
    program = built.program
    degree = exact_stacking(program.training.microbatches, program.stackable) if arithmetic == "exact" else 1
    stacking = Stacking(stacked_training(program, degree), degree)
    return Trainer(run, program, built.backend, built.feeder, stacking), built.initial_state(), built


def time_steps(path: Path, arithmetic: str, steps: int, seconds: float, device: str = "cuda", experiment=None,
               warmup: int | None = None) -> Timed:
    trainer, state, built = training(path, arithmetic, device, experiment)
    warmup = WARMUP[arithmetic] if warmup is None else warmup
    started = time.perf_counter()
    loss = trainer.step(state)["loss"]
    for _ in range(warmup - 1):
        trainer.step(state)
    synchronize()
    first = time.perf_counter() - started
    started, timed = time.perf_counter(), 0
    while timed < steps and (timed == 0 or time.perf_counter() - started < seconds):
        trainer.step(state)
        timed += 1
    synchronize()
    per_step = (time.perf_counter() - started) / timed
    captured, profile = {}, {}  # the CPU interpreter of a smoke run neither captures nor profiles
    if device == "cuda":
        graphs = trainer.stacking.training
        captured = {"microbatch": built.backend.is_captured(graphs.micro),
                    "update": built.backend.is_captured(graphs.update)}
        if built.program.training.sums is not None:
            captured["gradients' rounding"] = built.backend.rounding.is_captured()
        profile = built.backend.profile(built.program.training.micro, trainer.first_inputs(state))
    return Timed(per_step, timed, first, loss, phases(trainer, state), profile, captured, warmup)


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def phases(trainer, state) -> dict:
    """{phase: seconds} of one step, each phase waited for: the backend's calls by graph and
    the gradients' rounding, timed around the run loop's own calls; the rest is the loop's."""
    spent: dict = {}
    training = trainer.stacking.training
    names = {id(training.micro): "microbatch calls", id(training.update): "update call"}
    inside: list = []  # the phase being timed

    def timed(name_of, call):
        def run(*args, **kwargs):  # kwargs: the run loop's lent=, which names no phase
            if inside:  # a call made inside a timed phase (the rounding's graph run) is that phase's time
                return call(*args, **kwargs)
            name = name_of(*args)
            inside.append(name)
            synchronize()
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                synchronize()
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
                inside.pop()

        return run

    backend, sums = trainer.backend, trainer.sums
    backend.run = timed(lambda graph, inputs: names.get(id(graph), "other calls"), backend.run)
    trainer.sums = replace(sums, add=timed(lambda total, grads: "adding the gradients", sums.add),
                           rounded=timed(lambda total: "rounding the gradients", sums.rounded))
    try:
        synchronize()
        started = time.perf_counter()
        trainer.step(state)
        synchronize()
        spent["the rest"] = time.perf_counter() - started - sum(spent.values())
    finally:
        del backend.run  # the class's own again
        trainer.sums = sums
    return spent


def shares(seconds: dict) -> str:
    total = sum(seconds.values())
    return ", ".join(f"{kind} {value * 1e3:.1f} ms ({value / total:.0%})"
                     for kind, value in sorted(seconds.items(), key=lambda item: -item[1]))


def report(model: str, done: dict) -> harness.Report:
    """The lines and table of the two arithmetics; `done`: their rows' results by arithmetic."""
    timed = {arithmetic: Timed(**result.found) for arithmetic, result in done.items() if result.ok}
    lines = [f"{arithmetic} failed: {result.error}" for arithmetic, result in done.items() if not result.ok]
    table = []
    for arithmetic, found in timed.items():
        replayed = ", ".join(f"{graph} {'captured' if yes else 'eager'}"
                             for graph, yes in found.captured.items()) or "no CUDA graphs"
        lines.append(f"{arithmetic:<6} {found.seconds * 1e3:>10.1f} ms a step ({found.steps} timed after "
                     f"{found.warmup} warm-up steps of {found.first:.1f} s; {replayed}); first loss {found.loss:.6f}")
        table.append([arithmetic, f"{found.seconds * 1e3:.1f}", found.steps, found.warmup, replayed])
    if len(timed) == len(ARITHMETICS):
        ratio = timed["exact"].seconds / timed["float"].seconds
        lines.append(f"exact / float32: {ratio:.2f} (goal <= {GOAL}) {'met' if ratio <= GOAL else 'NOT met'}")
    for arithmetic, found in timed.items():
        lines.append(f"{arithmetic} step by phase: {shares(found.phases)}")
        lines.append(f"{arithmetic} profiled microbatch ({sum(found.profile.values()) * 1e3:.1f} ms): "
                     f"{shares(found.profile) or 'not profiled (the CPU interpreter)'}")
    for line in lines:
        print(f"  {line}")
    return harness.Report(f"bench_exact_mode-{model}", f"bench_exact_mode: {model}", list(done.values()),
                          ["arithmetic", "ms a step", "timed steps", "warm-up steps", "CUDA graphs"], table, lines)


def time_row(spec: dict) -> dict:
    """In a row's own process: one arithmetic's steps, on the GPU, or in a smoke run without
    one on the CPU interpreter with bench/exact_counts.py's mlp-tiny."""
    from sexpgpu.backends.select import cuda_problem

    arithmetic = spec["arithmetic"]
    if not spec["smoke"]:
        return asdict(time_steps(MODELS[spec["model"]], arithmetic, spec["steps"], spec["seconds"]))
    import exact_counts

    device = "cuda" if cuda_problem() is None else "cpu"
    path = ROOT / exact_counts.MODELS[SMOKE_MODEL][0]
    return asdict(time_steps(path, arithmetic, 1, 0.0, device, exact_counts.experiment(SMOKE_MODEL), warmup=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt-50m", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=5, help="timed steps at most (default 5)")
    parser.add_argument("--seconds", type=float, default=20.0, help="stop timing after this many seconds (default 20)")
    parser.add_argument("--counts", action="store_true", help="also count one exact step's syncs and launches")
    harness.add_options(parser)
    smoke.add_option(parser)
    args = parser.parse_args(argv)
    if args.row:
        harness.answer(time_row, args.row)
        return
    from sexpgpu.backends.select import cuda_problem

    problem = cuda_problem()
    if args.smoke:
        args.model = SMOKE_MODEL
        if problem is not None:
            smoke.skipped("the CUDA backend (the CPU interpreter takes the steps)", problem)
    elif problem is not None:
        parser.error(f"this benchmark runs on a GPU: {problem}")
    spec = {"model": args.model, "steps": args.steps, "seconds": args.seconds, "smoke": args.smoke}
    rows = [harness.Row(f"{args.model}/{arithmetic}", {**spec, "arithmetic": arithmetic}) for arithmetic in ARITHMETICS]
    done = dict(zip(ARITHMETICS, harness.run_rows(__file__, rows, args.row_timeout)))
    where = "bench/exact_counts.py" if args.smoke else MODELS[args.model].relative_to(ROOT)
    print(f"{args.model} ({where}), each arithmetic in its own process, TF32 off")
    folder = harness.results_folder(args.results, args.smoke)
    harness.write_results(report(args.model, done), folder, args.smoke)
    if args.counts and args.smoke:
        smoke.skipped("--counts", "bench/exact_counts.py --smoke counts mlp-tiny's step")
    elif args.counts:
        counted(MODELS[args.model])


def counted(path: Path) -> None:
    """bench/exact_counts.py's table for one exact step after one warm-up step."""
    import exact_counts

    trainer, state, _ = training(path, "exact")
    trainer.step(state)
    with exact_counts.counting() as counts:
        exact_counts.counted_step(trainer, state, counts)
    print(f"  exact step at stacking {trainer.stacking.degree}, host synchronisations and launches by phase:")
    exact_counts.report(counts.tallies, sites=3)


if __name__ == "__main__":
    main()
