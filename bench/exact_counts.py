"""Host synchronisations and launches of one exact training step, by phase: what explains its time.

    PYTHONPATH=src python bench/exact_counts.py [--model gpt-tiny|char-lm|gpt-small|gpt-50m|mlp-tiny] [--degree K]
                                                [--sites N] [--smoke]

Runs `:arithmetic exact` steps of a small GPT-style model through the run loop on the CUDA
backend (on the CPU under Triton's interpreter when there is no GPU: TRITON_INTERPRET=1 is set
before Triton loads) and counts, for the last step, in each phase of the step and each kind of
lowered step (exact-matmul, exact-sum, exact-region, elementwise, ...):

- host synchronisations: every PyTorch op that makes the host wait for the device on CUDA.
  A value read back (`.item()`, `int(t)`, `bool(t)`, `float(t)`: aten._local_scalar_dense or
  is_nonzero; torch.equal), an op whose result's size depends on the data (nonzero,
  unique, masked_select, a repeat_interleave without output_size, indexing with a boolean
  mask), and a copy to the host;
- launches: PyTorch ops that run a kernel (views and allocations do not), and Triton kernel
  launches apart, by kernel;
- calls of the exact library's entry points (det_gemm, det_gemm_batched, det_sum, ...).

Counted from the ops themselves (a TorchDispatchMode), so the figures are the same on the
CPU as on a GPU for the same data, except what the interpreter does inside a Triton kernel,
which is not counted. `--sites` lists where the syncs of each phase come from (file:line of
the innermost sexpgpu frame). Counts depend on the data only where the exact library's fast
paths do (how many outputs a bound settles); never the bits.

`gpt-tiny` is bench/gpt-small.sexp cut to seconds a step under the interpreter (2 layers,
width 16, 2 heads, context 8, batch 4, 2 microbatches, a vocabulary of 64); `char-lm` is
examples/char-lm.sexp as tests/cuda/test_exact_mode_interpret.py cuts it; `gpt-small` is the
file as written and `gpt-50m` is bench/gpt-50m.sexp (both for a GPU); `mlp-tiny` is
examples/tiny-adam.sexp cut to one hidden layer of 4 units and a batch of 2, which --smoke
counts (bench/smoke.py), with no warm-up step.
tests/cuda/test_exact_counts_interpret.py holds the counts of gpt-tiny to bounds, so that a
change that adds a sync or a per-parameter launch fails there. bench/exact_calls.py times the
same step call by call.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import smoke

ROOT = Path(__file__).resolve().parents[1]
SOURCE = str(ROOT / "src" / "sexpgpu")

# file, {text: replacement}: each model's edits of its file, made in order
MODELS = {
    "gpt-tiny": ("bench/gpt-small.sexp", {
        ":vocab 8192 :context 256 :width 256 :heads 4 :ff 1024 :layers 4":
            ":vocab 64 :context 8 :width 16 :heads 2 :ff 32 :layers 2",
        ":vocab 8192 :context 256": ":vocab 64 :context 8", "(batch 257)": "(batch 9)",
        ":stop 257": ":stop 9", ":width 256 :heads 4 :ff 1024": ":width 16 :heads 2 :ff 32",
        ":batch 16": ":batch 4 :microbatches 2 :arithmetic exact"}),
    "char-lm": ("examples/char-lm.sexp", {
        ":context 64 :width 64 :heads 4 :ff 256 :layers 2": ":context 4 :width 8 :heads 2 :ff 8 :layers 1",
        ":width 64 :heads 4 :ff 256": ":width 8 :heads 2 :ff 8", "(text pydoc :context 64)": "(text pydoc :context 4)",
        ":batch 16": ":batch 2 :microbatches 2 :arithmetic exact"}),
    "gpt-small": ("bench/gpt-small.sexp", {":batch 16": ":batch 16 :arithmetic exact"}),
    "gpt-50m": ("bench/gpt-50m.sexp", {":batch 32": ":batch 32 :arithmetic exact"}),
    "mlp-tiny": ("examples/tiny-adam.sexp", {
        ":hidden 64": ":hidden 4", "(let h2 (relu (linear h1 :out hidden :as fc2)))\n  (linear h2": "(linear h1",
        ":batch 64": ":batch 2 :arithmetic exact"}),
}


@dataclass
class Tally:
    """What one phase did."""

    syncs: Counter = field(default_factory=Counter)  # site -> host synchronisations
    torch_launches: int = 0
    triton: Counter = field(default_factory=Counter)  # kernel -> launches
    calls: Counter = field(default_factory=Counter)  # exact library entry point -> calls

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())

    @property
    def launches(self) -> int:
        return self.torch_launches + sum(self.triton.values())


def _aten():
    import torch

    aten = torch.ops.aten
    syncing = {aten._local_scalar_dense, aten.is_nonzero, aten.equal, aten.nonzero, aten.nonzero_static, aten.argwhere,
               aten.masked_select, aten.unique_consecutive, aten._unique2, aten._unique, aten.unique_dim, aten.allclose}
    indexing = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
    silent = {aten.empty, aten.empty_strided, aten.empty_like, aten.lift_fresh, aten.detach, aten._to_copy.default}
    return syncing, indexing, silent


class Counting:
    """Counts what the code inside `phase(name)` blocks does, into `tallies[name]`."""

    def __init__(self):
        self.tallies: dict[str, Tally] = {}
        self.current: list[str] = ["outside"]
        self.inside_kernel = 0
        self.syncing, self.indexing, self.silent = _aten()

    @contextlib.contextmanager
    def phase(self, name: str):
        self.current.append(name)
        try:
            yield
        finally:
            self.current.pop()

    def tally(self) -> Tally:
        return self.tallies.setdefault(self.current[-1], Tally())

    def op(self, func, args, kwargs) -> None:
        if self.inside_kernel:
            return
        packet = func.overloadpacket
        waits = packet in self.syncing or _bool_indexed(packet in self.indexing, args)
        if waits or _repeat_unsized(func, args, kwargs) or _to_host(func, args, kwargs):
            self.tally().syncs[_site()] += 1
        elif not func.is_view and packet not in self.silent and func not in self.silent:
            self.tally().torch_launches += 1

    def kernel(self, name: str) -> None:
        self.tally().triton[name] += 1

    def call(self, name: str) -> None:
        self.tally().calls[name] += 1


def _bool_indexed(indexing: bool, args) -> bool:
    """An index or index_put with a boolean mask: its size is the mask's count, read back."""
    import torch

    if not indexing or len(args) < 2:
        return False
    return any(isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in args[1] or ())


def _repeat_unsized(func, args, kwargs) -> bool:
    import torch

    return func.overloadpacket is torch.ops.aten.repeat_interleave and isinstance(args[0], torch.Tensor) and \
        isinstance(args[1] if len(args) > 1 else None, torch.Tensor) and kwargs.get("output_size") is None


def _to_host(func, args, kwargs) -> bool:
    """A copy whose source is a device tensor and whose target is the host's (on a GPU only)."""
    import torch

    if func.overloadpacket not in (torch.ops.aten._to_copy, torch.ops.aten.copy_):
        return False
    source = args[1] if func.overloadpacket is torch.ops.aten.copy_ else args[0]
    target = args[0].device if func.overloadpacket is torch.ops.aten.copy_ else kwargs.get("device")
    return isinstance(source, torch.Tensor) and source.device.type == "cuda" and target is not None and \
        torch.device(target).type == "cpu"


def _site() -> str:
    """file:line function of the innermost frame in sexpgpu's sources (else the innermost of ours)."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(SOURCE):
            return f"{os.path.relpath(path, SOURCE)}:{frame.f_lineno} {frame.f_code.co_name}"
        if fallback is None and str(ROOT) in path and "torch" not in path:
            fallback = f"{os.path.relpath(path, ROOT)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return fallback or "elsewhere"


# the exact library's entry points, counted where any module of ours holds them
ENTRY_POINTS = {
    "sexpgpu.exact.gemm": ("det_gemm", "det_gemm_partial", "det_combine", "det_finalize", "accumulate_planes"),
    "sexpgpu.exact.batched": ("det_gemm_batched",),
    "sexpgpu.exact.reduce": ("det_sum", "det_sum_partial"),
    "sexpgpu.exact.bounded_gemm": ("rounded_gemm",),
    "sexpgpu.exact.scatter": ("det_scatter_sum", "det_scatter_sum_partial"),
    # the CUDA backend's products written straight into their buffers (backends/exact_ops.py)
    "sexpgpu.exact.queued": ("queued_product",),
}


@contextlib.contextmanager
def counting():
    """A Counting whose phases collect every op, Triton launch and exact library call made in them."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = Counting()

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts.op(func, args, kwargs or {})
            return func(*args, **(kwargs or {}))

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched_triton(counts))
        stack.enter_context(_patched_host_reads(counts))
        stack.enter_context(_patched_entry_points(counts))
        stack.enter_context(Mode())
        yield counts
    del torch


@contextlib.contextmanager
def _patched_host_reads(counts: Counting):
    """`.cpu()` and `.tolist()` of a CPU tensor: under the interpreter every tensor is on the CPU,
    so these are the reads a GPU would make (on a GPU the dispatched copy is counted instead)."""
    import torch

    originals = {name: getattr(torch.Tensor, name) for name in ("cpu", "tolist")}

    def counted(original):
        def read(self, *args, **kwargs):
            if self.device.type == "cpu" and not counts.inside_kernel:
                counts.tally().syncs[_site()] += 1
            return original(self, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@contextlib.contextmanager
def _patched_triton(counts: Counting):
    """Triton launches counted by kernel name; what the interpreter does inside one is not counted."""
    def counted(name, launch):
        counts.kernel(name)
        counts.inside_kernel += 1
        try:
            return launch()
        finally:
            counts.inside_kernel -= 1

    with around_triton(counted):
        yield


@contextlib.contextmanager
def around_triton(around):
    """Every Triton launch, compiled or interpreted, made as around(kernel name, launch)."""
    import triton.runtime.interpreter as interpreter
    from triton.runtime.jit import JITFunction

    originals = {cls: cls.run for cls in (interpreter.InterpretedFunction, JITFunction)}

    def wrapped(original):
        def run(self, *args, **kwargs):
            if kwargs.get("warmup"):
                return original(self, *args, **kwargs)
            name = getattr(self, "__name__", None) or self.fn.__name__
            return around(name, lambda: original(self, *args, **kwargs))

        return run

    for cls, original in originals.items():
        cls.run = wrapped(original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.run = original


@contextlib.contextmanager
def _patched_entry_points(counts: Counting):
    def counting_call(name, original):
        def call(*args, **kwargs):
            counts.call(name)
            return original(*args, **kwargs)

        return call

    with wrapped_entry_points(counting_call):
        yield


@contextlib.contextmanager
def wrapped_entry_points(wrap):
    """Each of ENTRY_POINTS replaced by wrap(name, original) in every loaded sexpgpu module that holds it by name."""
    import importlib

    replaced = []
    for module_name, names in ENTRY_POINTS.items():
        module = importlib.import_module(module_name)
        for name in names:
            original = getattr(module, name)
            wrapper = wrap(name, original)
            for holder in [m for key, m in list(sys.modules.items()) if key.startswith("sexpgpu") and m is not None]:
                if getattr(holder, name, None) is original:
                    setattr(holder, name, wrapper)
                    replaced.append((holder, name, original))
    try:
        yield
    finally:
        for holder, name, original in replaced:
            setattr(holder, name, original)


# --- a step, phase by phase -----------------------------------------------------------------------


def experiment(model: str):
    file, edits = MODELS[model]
    return smoke.edited_experiment(ROOT / file, edits)


def exact_backend():
    """The exact CUDA backend: on the GPU, else on CPU tensors under Triton's interpreter, with the
    step digest's fingerprints taken on the host (the interpreter takes seconds for each)."""
    import torch

    from sexpgpu.backends.cpu import Interpreter
    from sexpgpu.backends.cuda.backend import CudaBackend

    if torch.cuda.is_available():
        return CudaBackend()
    host = Interpreter()

    class HostDigests(CudaBackend):
        def fingerprints(self, values: list) -> list[int]:
            return host.fingerprints([CudaBackend.to_host(self, value) for value in values])

    return HostDigests(device="cpu")


def trainer_for(chosen, backend, degree: int | None):
    """(trainer, state) of the run on `backend` at stacking `degree` (None: plan/choices.py's
    exact_stacking, what an exact run takes on a GPU)."""
    from sexpgpu.plan.choices import exact_stacking
    from sexpgpu.run.choosing import stacked_training
    from sexpgpu.run.loop import Stacking, Trainer
    from sexpgpu.run.setup import build_run

    built = build_run(chosen, "cpu")
    built.backend = built.feeder.backend = backend
    if degree is None:
        degree = exact_stacking(built.program.training.microbatches, built.program.stackable)
    trainer = Trainer(chosen.run, built.program, backend, built.feeder,
                      Stacking(stacked_training(built.program, degree), degree))
    return trainer, built.initial_state()


def counted_step(trainer, state, counts: Counting) -> None:
    """One step with every call of the backend and the loop's sums in its phase; inside a
    graph's run, each lowered step in `<phase>: <kind of step>`."""
    from sexpgpu.backends.cuda import runtime

    training, backend, sums = trainer.stacking.training, trainer.backend, trainer.sums
    graphs = {id(training.micro): "microbatch calls", id(training.update): "update call"}
    if training.sums is not None:  # a step's sums are graphs the backend runs (graph/passes/exact_region.py)
        graphs.update({id(training.sums.accumulate): "adding the gradients", id(training.sums.rounding): "rounding the gradients"})
    within: list[str] = ["the loop"]

    def in_phase(name_of, call):
        def run(*args, **kwargs):  # kwargs: the run loop's lent=, which names no phase
            name = name_of(*args)
            within.append(name)
            try:
                with counts.phase(name):
                    return call(*args, **kwargs)
            finally:
                within.pop()

        return run

    execute = runtime.Executable.execute

    def execute_by_kind(self, env):
        for launch in self.lowered.launches:
            with counts.phase(f"{within[-1]}: {launch.kind}"):
                launch(env)

    form = backend._form_pending
    backend.run = in_phase(lambda graph, inputs: graphs.get(id(graph), "other calls"), backend.run)
    backend._form_pending = in_phase(lambda graph: "forming held sums", form)
    backend.to_host = in_phase(lambda value: "reading back", backend.to_host)
    backend.fingerprints = in_phase(lambda values: DIGEST, backend.fingerprints)
    trainer.sums = replace(sums, add=in_phase(lambda total, grads: "adding the gradients", sums.add),
                           rounded=in_phase(lambda total: "rounding the gradients", sums.rounded),
                           mean=in_phase(lambda values: MEAN, sums.mean))
    runtime.Executable.execute = execute_by_kind
    try:
        with counts.phase("the loop"):
            trainer.step(state)
    finally:
        runtime.Executable.execute = execute
        for name in ("run", "_form_pending", "to_host", "fingerprints"):
            del backend.__dict__[name]
        trainer.sums = sums


def count_step(model: str = "gpt-tiny", degree: int | None = None, warmup: int = 1) -> tuple:
    """({phase: Tally} of one exact step of `model` after `warmup` steps (lowering, first
    calls), the stacking degree): at `degree`, or the one an exact run takes on a GPU."""
    chosen = experiment(model)
    trainer, state = trainer_for(chosen, exact_backend(), degree)
    for _ in range(warmup):
        trainer.step(state)
    with counting() as counts:
        counted_step(trainer, state, counts)
    return counts.tallies, trainer.stacking.degree


MEAN, DIGEST = "the loss's mean", "the digest"
# phases whose tensors are the host's on a GPU (the loss values read back; the digest, which
# the interpreted backend here takes on the host): their reads are no device syncs there
HOST_PHASES = (MEAN, DIGEST)


def totals(tallies: dict) -> Tally:
    """The device's phases together (not HOST_PHASES)."""
    total = Tally()
    for name, tally in tallies.items():
        if name in HOST_PHASES:
            continue
        total.syncs.update(tally.syncs)
        total.torch_launches += tally.torch_launches
        total.triton.update(tally.triton)
        total.calls.update(tally.calls)
    return total


def report(tallies: dict, sites: int) -> None:
    rows = sorted(tallies.items(), key=lambda item: (-item[1].sync_count, -item[1].launches, item[0]))
    print(f"  {'phase':<52} {'syncs':>6} {'torch ops':>10} {'triton':>7}  exact library calls")
    for name, tally in [*rows, ("all on the device", totals(tallies))]:
        calls = ", ".join(f"{call} {count}" for call, count in sorted(tally.calls.items()))
        label = f"{name} (host tensors)" if name in HOST_PHASES else name
        triton = sum(tally.triton.values())
        print(f"  {label:<52} {tally.sync_count:>6} {tally.torch_launches:>10} {triton:>7}  {calls}")
        for site, count in tally.syncs.most_common(sites):
            print(f"      {count:>5}  {site}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt-tiny", choices=sorted(MODELS))
    parser.add_argument("--degree", type=int, default=None,
                        help="stacking degree (divides the microbatches); the exact run's on a GPU by default")
    parser.add_argument("--sites", type=int, default=0, help="list this many sync sites of each phase")
    smoke.add_option(parser)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if args.smoke:
        args.model = "mlp-tiny"
    tallies, degree = count_step(args.model, args.degree, warmup=0 if args.smoke else 1)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "the CPU, under Triton's interpreter"
    print(f"{args.model}, one exact step at stacking {degree}, on {where}:")
    report(tallies, args.sites)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
