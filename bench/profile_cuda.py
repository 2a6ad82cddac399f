"""Where one training step's time goes on the CUDA backend, step by step, beside the same
model's PyTorch eager kernels: the tool for finding what to make faster.

    PYTHONPATH=src python3 bench/profile_cuda.py [--model gpt-50m] [--precision f32|bf16] [--top 40] [--smoke]

Ours: every step of the microbatch graph and of the update graph, timed with CUDA events,
grouped by kind and the shapes it reads and writes, with the experiment's `:precision` set
to `--precision`. Eager: torch.profiler's CUDA kernels of one step of the PyTorch peer of
that precision (bench_cuda.py's eager row: SDPA, fused AdamW, bf16 autocast for bf16), grouped
by name, profiled before our device set-up changes torch's global flags. --smoke:
bench_cuda.py's tiny char-lm (bench/smoke.py); without a GPU, the eager step's CPU ops alone:
our steps are timed with CUDA events.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import smoke  # noqa: E402
from bench_cuda import MODELS, SMOKE_MODEL, SMOKE_MODELS, OurStep, seconds_per_step, torch_step  # noqa: E402


def launch_label(lowered, launch) -> str:
    shapes = lambda keys: ",".join("x".join(map(str, lowered.buffers[key].shape)) for key in keys if key in lowered.buffers)
    return f"{launch.kind:<13} R[{shapes(launch.reads)}] W[{shapes(launch.writes)}]"


def our_steps(ours: OurStep, graph, inputs: dict) -> list[tuple[str, float, int]]:
    lowered = ours.backend.lowered(graph)
    ours.backend.launch_seconds(graph, inputs)  # warm: every kernel compiled
    rows = defaultdict(lambda: [0.0, 0])
    for launch, seconds in ours.backend.launch_seconds(graph, inputs):
        row = rows[launch_label(lowered, launch)]
        row[0] += seconds * 1e3
        row[1] += 1
    return sorted(((label, ms, count) for label, (ms, count) in rows.items()), key=lambda item: -item[1])


def replay_milliseconds(ours: OurStep, graph, inputs: dict, count: int = 5) -> float:
    """Wall time of one call of the backend (the captured graph, inputs copied in and
    outputs copied out), the GPU drained before and after."""
    return seconds_per_step(lambda: ours.backend.run(graph, inputs), count, 1) * 1e3


def captured_parts(ours: OurStep, graph, inputs: dict, count: int = 5) -> str:
    """Milliseconds of a captured call's parts: copying the inputs in, the replay, copying
    the outputs out, each timed alone with the GPU drained around it."""
    import torch

    from sexpgpu.backends.cuda.runtime import _copy_all

    captured = ours.backend._entry(graph)[2]
    if getattr(captured, "graph", None) is None:
        return "not captured"
    lowered = captured.executable.lowered
    accepted = {name: ours.backend._accept(name, graph.inputs[name], value) for name, value in inputs.items()}
    parts = {
        "inputs in": lambda: _copy_all([captured.env[key] for key in lowered.inputs.values()],
                                       [accepted[name] for name in lowered.inputs]),
        "replay": captured.graph.replay,
        "outputs out": lambda: [captured.env[key].clone() for key in lowered.outputs.values()],
        "accept inputs": lambda: {name: ours.backend._accept(name, graph.inputs[name], value) for name, value in inputs.items()},
    }
    timed = [f"{name} {seconds_per_step(part, count, 1) * 1e3:.2f} ms" for name, part in parts.items()]
    return ", ".join(timed)


# what the eager step's table counts, by the device it runs on: the profiler's activity, the
# events kept and each one's microseconds (CPU ops nest, so each counts its own time only)
KERNELS = {"cuda": ("CUDA kernels", "CUDA", lambda event: event.device_time),
           "cpu": ("CPU ops", "CPU", lambda event: event.self_cpu_time_total)}


def eager_kernels(name: str, precision: str, device: str, warmup: int = 3) -> list[tuple[str, float, int]]:
    """The eager peer's kernels; called before our device set-up, so with PyTorch's defaults."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    _, kind, microseconds = KERNELS[device]
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    step = torch_step(name, {**MODELS, **SMOKE_MODELS}[name], precision, False, device)
    for _ in range(warmup):
        step()
    synchronize()
    with profile(activities=[getattr(ProfilerActivity, kind)]) as recorded:
        step()
        synchronize()
    rows = defaultdict(lambda: [0.0, 0])
    for event in recorded.events():
        if event.device_type == getattr(torch.autograd.DeviceType, kind):
            row = rows[event.name[:90]]
            row[0] += microseconds(event) / 1e3
            row[1] += 1
    return sorted(((label, ms, count) for label, (ms, count) in rows.items()), key=lambda item: -item[1])


def show(title: str, rows, top: int) -> None:
    total = sum(ms for _, ms, _ in rows)
    print(f"\n{title}: {total:.2f} ms in all")
    for label, ms, count in rows[:top]:
        print(f"  {ms:8.3f} ms {count:4d}x  {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt-50m", choices=sorted(MODELS))
    parser.add_argument("--precision", default="f32", choices=("f32", "bf16"))
    parser.add_argument("--top", type=int, default=40)
    smoke.add_option(parser)
    args = parser.parse_args()
    if args.smoke:
        smoke_run(args)
        return
    eager = eager_kernels(args.model, args.precision, "cuda")
    profile_ours(OurStep(MODELS[args.model], args.precision), args.top)
    show(f"PyTorch eager ({args.precision}), one step, CUDA kernels", eager, args.top)


def smoke_run(args) -> None:
    """bench_cuda.py's tiny char-lm, one step after one: ours on a GPU, the eager peer's ops anywhere."""
    device = "cuda" if smoke.gpu() else "cpu"
    eager = eager_kernels(SMOKE_MODEL, args.precision, device, warmup=1)
    if device == "cuda":
        profile_ours(OurStep(SMOKE_MODELS[SMOKE_MODEL], args.precision), args.top, warmup=1)
    else:
        smoke.skipped("our steps' tables (the CUDA backend's steps, timed with CUDA events)")
    show(f"PyTorch eager ({args.precision}), one step, {KERNELS[device][0]}", eager, args.top)


def profile_ours(ours: OurStep, top: int, warmup: int = 2) -> None:
    """The tables of our steps: each step of the microbatch and update graphs, and their calls."""
    for _ in range(warmup):
        ours()
    training = ours.built.program.training
    micro = ours.micro_inputs()
    update = ours.update_inputs(ours.backend.run(training.micro, micro))
    show("ours, microbatch graph, steps", our_steps(ours, training.micro, micro), top)
    show("ours, update graph, steps", our_steps(ours, training.update, update), 12)
    print(f"\nours, one call each: microbatch graph {replay_milliseconds(ours, training.micro, micro):.2f} ms, "
          f"update graph {replay_milliseconds(ours, training.update, update):.2f} ms")
    print(f"ours, captured microbatch call: {captured_parts(ours, training.micro, micro)}")
    print(f"ours, captured update call: {captured_parts(ours, training.update, update)}")


if __name__ == "__main__":
    main()
