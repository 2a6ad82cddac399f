"""What each rank runs in test_exact_gradients_gloo.py: its share of a step's microbatches,
their gradient accumulators combined exactly, then summed over the ranks with
sexpgpu.exact.det_all_reduce and rounded once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exact"))
from exact_dist_worker import join_world  # noqa: E402

from sexpgpu.exact import det_all_reduce, det_finalize  # noqa: E402
from sexpgpu.lang.forms import parse_experiment, select_run  # noqa: E402
from sexpgpu.lang.reader import read_text  # noqa: E402
from sexpgpu.run.setup import build_run  # noqa: E402

TINY_ADAM = Path(__file__).resolve().parents[2] / "examples" / "tiny-adam.sexp"
MICROBATCHES = 4


def exact_run():
    text = TINY_ADAM.read_text().replace(":batch 64", f":batch 8 :microbatches {MICROBATCHES} :arithmetic exact")
    experiment = select_run(parse_experiment(read_text(text, str(TINY_ADAM)), str(TINY_ADAM), ""), None)
    return build_run(experiment, "cpu")


def accumulated(built, microbatches) -> dict:
    """{grad/<path>: Accumulator}: step 1's gradients of these microbatches, combined exactly."""
    state = built.initial_state()
    micro = built.program.training.micro
    total = None
    for microbatch in microbatches:
        inputs = {f"param/{path}": value for path, value in state.params.items()}
        inputs.update(built.feeder.train_batch(1, microbatch))
        inputs.update({"step": 1, "microbatch": microbatch})
        outputs = built.backend.run(micro, {name: inputs[name] for name in micro.inputs})
        grads = {name: value for name, value in outputs.items() if name.startswith("grad/")}
        sums = built.program.training.sums  # the exact step's graphs (graph/passes/exact_region.py)
        totals = {f"total/{name}": value for name, value in (total or {}).items()}
        total = grads if total is None else built.backend.run(sums.accumulate, {**totals, **grads})
    return total


def one_process() -> dict:
    return {name: det_finalize(acc) for name, acc in accumulated(exact_run(), range(MICROBATCHES)).items()}


def run(rank: int, world: int, out_dir: str) -> None:
    join_world(rank, world, out_dir)
    try:
        mine = accumulated(exact_run(), range(rank, MICROBATCHES, world))  # microbatches r, r + world, ...
        rounded = {name: det_finalize(det_all_reduce(acc)) for name, acc in mine.items()}
        torch.save(rounded, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
