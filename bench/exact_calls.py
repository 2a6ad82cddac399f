"""Where an exact training step's time goes, call by call: each exact library call of one step,
by entry point and operand layout, with the Triton kernels it launched.

    PYTHONPATH=src python bench/exact_calls.py [--model gpt-50m|gpt-small|gpt-tiny|char-lm|mlp-tiny] [--rows N]
                                               [--smoke]

Runs one exact step of the model (bench/exact_counts.py's models and set-up: the run loop on
the CUDA backend, stacked as an exact run is on a GPU) after one warm-up step, and times every
outermost call of the exact library's entry points (det_gemm, det_gemm_batched, det_sum, ...)
and every Triton launch inside one. On a GPU both are timed by CUDA events on the current
stream, so a call's time includes the GPU's idle time while the host launches its kernels: a
call whose time is much more than its kernels' is bound by its launches. Calls are grouped by
entry point, operand shapes and strides (a weight's gradient reads transposed operands), most
time first. Without a GPU the step runs under Triton's interpreter and the times are the
host's: only the table's rows and kernels mean anything there. --smoke: mlp-tiny
(bench/exact_counts.py), no warm-up step, 3 rows (bench/smoke.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import exact_counts  # noqa: E402  (its models, its step set-up and the entry points it counts)
import smoke  # noqa: E402


@dataclass
class CallTimes:
    """One group of calls: how many, their time, and each Triton kernel's time inside them."""

    calls: int = 0
    seconds: float = 0.0
    kernels: dict = field(default_factory=lambda: defaultdict(float))  # kernel -> seconds


class Clock:
    """Intervals on the GPU's timeline (CUDA events, read once at the end) or, without a GPU, the host's."""

    def __init__(self):
        import torch

        self.torch = torch
        self.on_gpu = torch.cuda.is_available()
        self.pending: list = []  # (record to add to, key, start, end)

    def start(self):
        if not self.on_gpu:
            return time.perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started, add) -> None:
        if not self.on_gpu:
            add(time.perf_counter() - started)
            return
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        self.pending.append((add, started, event))

    def settle(self) -> None:
        """Read every interval recorded on the GPU (one wait, after the step)."""
        if self.on_gpu:
            self.torch.cuda.synchronize()
        for add, started, ended in self.pending:
            add(started.elapsed_time(ended) / 1e3)
        self.pending.clear()


class Timing:
    """Collects CallTimes by call label while `timing()` is active."""

    def __init__(self):
        self.groups: dict[str, CallTimes] = defaultdict(CallTimes)
        self.clock = Clock()
        self.label: str | None = None  # the outermost call in progress

    def call(self, name: str, original):
        def timed(*args, **kwargs):
            if self.label is not None:  # an entry point inside another: its kernels are the outer call's
                return original(*args, **kwargs)
            self.label = call_label(name, args)
            group = self.groups[self.label]
            group.calls += 1
            started = self.clock.start()
            try:
                return original(*args, **kwargs)
            finally:
                self.clock.stop(started, lambda seconds: setattr(group, "seconds", group.seconds + seconds))
                self.label = None

        return timed

    def kernel(self, name: str, launch):
        if self.label is None:
            return launch()
        kernels = self.groups[self.label].kernels
        started = self.clock.start()
        try:
            return launch()
        finally:
            self.clock.stop(started, lambda seconds: kernels.__setitem__(name, kernels[name] + seconds))


def call_label(name: str, args) -> str:
    """name(shapes)(strides) of a call's tensor arguments."""
    import torch

    tensors = [value for value in args if isinstance(value, torch.Tensor)]
    shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
    strides = ", ".join(str(t.stride()) for t in tensors)
    return f"{name}({shapes}) strides ({strides})"


@contextlib.contextmanager
def timing():
    """A Timing of every outermost exact library call made inside, and of the Triton kernels it launches."""
    times = Timing()
    with contextlib.ExitStack() as stack:
        stack.enter_context(exact_counts.wrapped_entry_points(times.call))
        stack.enter_context(exact_counts.around_triton(times.kernel))
        yield times
    times.clock.settle()


def time_step(model: str, warmup: int = 1) -> tuple:
    """(Timing of one exact step of `model` after `warmup` steps, the step's own seconds)."""
    import torch

    backend = exact_counts.exact_backend()
    backend.capture = False  # a replay calls no entry point, and events cannot be timed inside a capture
    trainer, state = exact_counts.trainer_for(exact_counts.experiment(model), backend, None)
    for _ in range(warmup):
        trainer.step(state)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    with timing() as times:
        trainer.step(state)
    return times, time.perf_counter() - started


def report(times: Timing, rows: int) -> None:
    groups = sorted(times.groups.items(), key=lambda item: -item[1].seconds)
    total = sum(group.seconds for _, group in groups)
    print(f"  {'ms':>9} {'calls':>6}  call: its Triton kernels, ms ({total * 1e3:.1f} ms in exact calls)")
    for label, group in groups[:rows]:
        kernels = ", ".join(f"{name} {seconds * 1e3:.1f}"
                            for name, seconds in sorted(group.kernels.items(), key=lambda item: -item[1]))
        print(f"  {group.seconds * 1e3:>9.1f} {group.calls:>6}  {label}: {kernels or 'no Triton kernel'}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(exact_counts.MODELS),
                        help="gpt-50m on a GPU, gpt-tiny under the interpreter by default")
    parser.add_argument("--rows", type=int, default=25, help="groups of calls to print, most time first")
    smoke.add_option(parser)
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    if args.smoke:
        args.model, args.rows = "mlp-tiny", 3
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    model = args.model or ("gpt-50m" if torch.cuda.is_available() else "gpt-tiny")
    times, seconds = time_step(model, warmup=0 if args.smoke else 1)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "the CPU, under Triton's interpreter"
    print(f"{model}, one exact step ({seconds * 1e3:.1f} ms while timed) on {where}:")
    report(times, args.rows)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
