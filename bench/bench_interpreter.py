"""The CPU interpreter's step time against the same models in PyTorch CPU eager.

    python bench/bench_interpreter.py [--steps N] [--rounds R] [--torch-threads T] [--only MODEL] [--smoke]

Both sides run forward, backward and the optimizer update (char-lm: with clipping by global
norm, as the example does) on the same shapes, in one process. The machine may be shared,
so the figure is CPU time (time.process_time: every thread of this process; PyTorch's
OpenMP threads wait passively, OMP_WAIT_POLICY=PASSIVE unless set, so that they neither spin
during the interpreter's turn nor bill it) per step: the two sides take turns, `rounds`
times `steps` steps each, and each side's best round counts (short rounds, many of them:
the best is the round the other load on the machine disturbed least). Wall time per step (best
round) is printed too. The ratio is interpreter time / PyTorch time (goals: char-lm within
2.0x and tiny-adam within 1.5x, with --torch-threads 1 and 2). --smoke: one step, one round
(bench/smoke.py). Written: bench/results/bench_interpreter-T-threads.json and .md
(bench/harness.py's writer; --results DIR elsewhere)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# PyTorch's OpenMP threads wait for work by spinning: between its rounds they would keep the
# cores busy during the interpreter's turn, slowing it and billing it their CPU time
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402 (after the setting above, which OpenMP reads when torch loads it)

from sexpgpu.lang.forms import load_experiment
from sexpgpu.run.loop import Trainer
from sexpgpu.run.setup import build_run

import harness
import smoke
import torch_models

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"tiny-adam": 1.5, "char-lm": 2.0}  # interpreter CPU time / PyTorch CPU time, at most
COLUMNS = ["model", "interpreter CPU ms", "in graph runs", "PyTorch CPU ms", "ratio", "goal", "interpreter wall ms",
           "PyTorch wall ms", "wall ratio"]


class GraphClock:
    """CPU time spent inside the backend's graph runs, as opposed to the rest of the run
    loop (the data feed, the learning-rate schedule, digests)."""

    def __init__(self, backend):
        self.seconds = 0.0
        self._run = backend.run
        backend.run = self._timed

    def _timed(self, graph, inputs, **options):  # options: the run loop's lent=, passed on
        started = time.process_time()
        try:
            return self._run(graph, inputs, **options)
        finally:
            self.seconds += time.process_time() - started


def interpreter_stepper(example: str):
    experiment = load_experiment(str(ROOT / "examples" / example))
    built = build_run(experiment, "cpu")
    state = built.initial_state()
    trainer = Trainer(experiment.run, built.program, built.backend, built.feeder)
    clock = GraphClock(built.backend)
    step = lambda: trainer.step(state)
    step.clock = clock
    return step


def torch_stepper(model, optimizer, make_batch, loss_of, clip=None):
    def one_step():
        x, y = make_batch()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()

    return one_step


def torch_tiny():
    model = torch_models.MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    batch = lambda: (torch.randn(64, 2), torch.randint(0, 3, (64,)))
    return torch_stepper(model, optimizer, batch, torch.nn.functional.cross_entropy)


def torch_char_lm():
    model = torch_models.CharLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.01)
    batch = lambda: (torch.randint(0, 256, (16, 64)), torch.randint(0, 256, (16, 64)))

    def loss_of(logits, y):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))

    return torch_stepper(model, optimizer, batch, loss_of, clip=1.0)


def timed_round(step, steps: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per step over `steps` steps."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
    return (time.process_time() - cpu) / steps, (time.perf_counter() - wall) / steps


def compare(ours, theirs, steps: int, rounds: int) -> tuple:
    """Best (CPU, wall) per step of each side, and the interpreter's graph share of its best
    CPU round."""
    ours(), theirs()  # warm-up: first-touch allocations, plan caches
    best = {"ours": (float("inf"),) * 2, "theirs": (float("inf"),) * 2}
    graphs = float("inf")
    for _ in range(rounds):
        for side, step in (("ours", ours), ("theirs", theirs)):
            if side == "ours":
                ours.clock.seconds = 0.0
            cpu, wall = timed_round(step, steps)
            if side == "ours" and cpu < best["ours"][0]:
                graphs = ours.clock.seconds / steps
            best[side] = (min(best[side][0], cpu), min(best[side][1], wall))
    return best["ours"], best["theirs"], graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="steps per timed round (default: tiny 10, char-lm 1)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per side, the best counts "
                                                                  "(default: tiny 30, char-lm 6)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch.set_num_threads; 0 keeps torch's own (default 1: its least CPU time per step)")
    parser.add_argument("--only", choices=("tiny-adam", "char-lm"), default=None)
    parser.add_argument("--results", type=Path, default=None,
                        help="where to write the results (default bench/results/; --smoke: a temporary folder)")
    smoke.add_option(parser)
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rounds = 1, 1
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
        # the interpreter gets as many threads as torch, unless told otherwise
        os.environ.setdefault("SEXPGPU_CPU_THREADS", str(args.torch_threads))
    threads = os.environ.get("SEXPGPU_CPU_THREADS", "its own count of")
    print(f"torch {torch.__version__} on {torch.get_num_threads()} threads, the interpreter on {threads} threads; "
          "CPU and wall ms per step, best round")
    print(f"{'model':<11}{'interp cpu ms':>14}{'(graphs)':>10}{'torch cpu ms':>14}{'ratio':>7}   "
          f"{'interp wall ms':>15}{'torch wall ms':>14}{'ratio':>7}")
    models = (("tiny-adam", "tiny-adam.sexp", torch_tiny, 10, 30), ("char-lm", "char-lm.sexp", torch_char_lm, 1, 6))
    rows, table = [], []
    for name, example, peer, steps, rounds in models:
        if args.only and args.only != name:
            continue
        started = time.perf_counter()
        (our_cpu, our_wall), (their_cpu, their_wall), graphs = compare(interpreter_stepper(example), peer(),
                                                                       args.steps or steps, args.rounds or rounds)
        print(f"{name:<11}{our_cpu * 1e3:>14.2f}{graphs * 1e3:>10.2f}{their_cpu * 1e3:>14.2f}{our_cpu / their_cpu:>7.2f}   "
              f"{our_wall * 1e3:>15.2f}{their_wall * 1e3:>14.2f}{our_wall / their_wall:>7.2f}")
        found = {"interpreter_cpu_ms": our_cpu * 1e3, "graphs_cpu_ms": graphs * 1e3, "torch_cpu_ms": their_cpu * 1e3,
                 "interpreter_wall_ms": our_wall * 1e3, "torch_wall_ms": their_wall * 1e3}
        rows.append(harness.RowResult(name, time.perf_counter() - started, found))
        table.append([name, f"{our_cpu * 1e3:.2f}", f"{graphs * 1e3:.2f}", f"{their_cpu * 1e3:.2f}",
                      f"{our_cpu / their_cpu:.2f}", f"<= {GOALS[name]}", f"{our_wall * 1e3:.2f}",
                      f"{their_wall * 1e3:.2f}", f"{our_wall / their_wall:.2f}"])
    print("(graphs): CPU time in the interpreter's graph runs; the rest of a step is the run loop's "
          "data feed, learning-rate schedule and digest")
    title = f"bench_interpreter: the CPU interpreter against PyTorch CPU eager, {threads} threads"
    label = threads if threads.isdigit() else "default"
    report = harness.Report(f"bench_interpreter-{label}-threads", title, rows, COLUMNS, table,
                            settings={"torch threads": torch.get_num_threads(), "interpreter threads": threads})
    harness.write_results(report, harness.results_folder(args.results, args.smoke), args.smoke)


if __name__ == "__main__":
    main()
