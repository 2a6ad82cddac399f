"""The CUDA backend's step time against the same models in plain PyTorch, on one GPU.

    PYTHONPATH=src python3 bench/bench_cuda.py [--quick] [--steps N] [--models char-lm,gpt-50m,cnn]
                                               [--rows ours-f32,ours-bf16,eager-f32,...] [--smoke]

For each model, in one process, the step time (forward, loss, gradients, AdamW with
clipping) of each row:

- `ours-f32`, `ours-bf16`: `sexpgpu` on the CUDA backend, the experiment as written and with
  `:precision bf16` (bf16 products summed in float32; graph/passes/precision.py), with the machine's
  choices made as `sexpgpu run` makes them by default (run/choosing.py's `choose`: each long
  float32 product's implementation timed at the first step);
- `eager-f32`, `compile-f32`: the model as a PyTorch user writes it today (bench/torch_models.py
  with F.scaled_dot_product_attention(is_causal=True), torch.optim.AdamW(fused=True),
  clip_grad_norm_), eager and under torch.compile, float32 with TF32 off;
- `eager-bf16`, `compile-bf16`: the same under torch.autocast(bfloat16);
- `eager-f32-written`, `compile-f32-written`: the earlier peer: attention written out step by
  step and the unfused AdamW, float32.

The CNN (examples/cnn.sexp) has its peer in bench/torch_models.py too: the same network with
Adam (fused), on noise images, with `cudnn.benchmark` on for every peer.

The peers run without PyTorch's deterministic-algorithms mode, as plain PyTorch does.
Printed: each row's time, the goal ratios (peer/ours at least 1.0 against eager, ours/peer at
most 1.25 against torch.compile, for float32 and bf16), the TFLOP/s our products reach, and
where our step's time goes, from one profiled step per precision. `--quick` times gpt-50m
only, with 5 steps after 2 warm-up steps and without `compile-f32-written` (a few minutes on
an H200, most of it compiling). `--smoke`: char-lm cut to milliseconds a step, one step after
none, the eager rows only (bench/smoke.py); without a GPU the peers run on the CPU and the CPU
interpreter stands in for the CUDA backend (no profile), so only the lines' shape means anything.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import smoke

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cuda"  # where every row runs: "cpu" in a smoke run without a GPU
MODELS = {
    "char-lm": (ROOT / "examples" / "char-lm.sexp", dict(vocab=256, context=64, width=64, heads=4, ff=256, layers=2), 16),
    "gpt-50m": (ROOT / "bench" / "gpt-50m.sexp", dict(vocab=24576, context=512, width=512, heads=8, ff=2048, layers=8), 32),
    "cnn": (ROOT / "examples" / "cnn.sexp", dict(size=12, width=8, wide=16, classes=2), 32),
}
SMOKE_MODEL = "char-lm-tiny"  # --smoke's: the file's edits are smoke.TINY_CHAR_LM
SMOKE_MODELS = {SMOKE_MODEL: (ROOT / "examples" / "char-lm.sexp", smoke.TINY_CHAR_LM_PEER, 2)}


class OurStep:
    """One training step of the experiment on the CUDA backend."""

    def __init__(self, path: Path, precision: str = "f32", edits: dict | None = None):
        from dataclasses import replace

        from sexpgpu.lang.forms import load_experiment
        from sexpgpu.run.setup import build_run

        experiment = smoke.edited_experiment(path, edits) if edits else load_experiment(str(path))
        run = replace(experiment.run, precision=precision)
        self.experiment = replace(experiment, runs={**experiment.runs, run.name: run})
        self.built = build_run(self.experiment, DEVICE)
        self.backend = self.built.backend
        self.state = self.built.initial_state()
        self.step_number = 0
        self.choices = self._choose()

    def _choose(self):
        """The choices `sexpgpu run` makes by default, handed to the backend."""
        from sexpgpu.run.choosing import ChoiceSettings, choose
        from sexpgpu.run.loop import Trainer

        first = Trainer(self.experiment.run, self.built.program, self.backend, self.built.feeder)
        chosen = choose(self.built, ChoiceSettings(), None, lambda: first.first_inputs(self.state))
        self.backend.take_choices(chosen.choices)
        return chosen.choices

    def chosen_products(self) -> str:
        counts: dict = {}
        for implementation in (self.choices.products or {}).values():
            counts[implementation] = counts.get(implementation, 0) + 1
        return ", ".join(f"{count} {name}" for name, count in sorted(counts.items())) or "none timed"

    def inputs(self, graph, values: dict) -> dict:
        return {name: values[name] for name in graph.inputs}

    def micro_inputs(self) -> dict:
        values = {f"param/{path}": value for path, value in self.state.params.items()}
        values.update(self.built.feeder.train_batch(self.step_number + 1, 0))
        values.update({"step": np.int32(self.step_number + 1), "microbatch": np.int32(0)})
        return self.inputs(self.built.program.training.micro, values)

    def update_inputs(self, outputs: dict) -> dict:
        from sexpgpu.run.schedule import learning_rate

        run = self.experiment.run
        values = {f"param/{path}": value for path, value in self.state.params.items()}
        values.update({name: value for name, value in outputs.items() if name.startswith("grad/")})
        values.update(self.state.optimizer)
        values.update({"step": np.int32(self.step_number),
                       "lr": learning_rate(run.schedule, run.optimizer.lr, self.step_number, run.steps)})
        return self.inputs(self.built.program.training.update, values)

    def __call__(self) -> None:
        training = self.built.program.training
        self.step_number += 1
        # lent, as the run loop takes them (run/loop.py): no copies of the outputs
        outputs = self.backend.run(training.micro, self.micro_inputs(), lent=True)
        updated = self.backend.run(training.update, self.update_inputs(outputs), lent=True)
        self.state.params = {name[6:]: value for name, value in updated.items() if name.startswith("param/")}
        self.state.optimizer = {name: value for name, value in updated.items() if name.startswith("state/")}

    def product_flops(self) -> int:
        """Flops of the products of one step: 2 M N K for each, batches included; the fused
        attention counts the products of the composition it stands for (two forward, four
        backward: dP and dQ with attention_grad_q, dK and dV with attention_grad_kv), the
        masked half of a causal one included, as before it was fused."""
        total = 0
        for node in self.built.program.training.micro.nodes:
            if node.op == "matmul":
                total += 2 * int(np.prod(node.shape)) * node.inputs[0].shape[-1]
            elif node.op in ATTENTION_PRODUCTS:
                q, k = node.inputs[:2]
                total += ATTENTION_PRODUCTS[node.op] * 2 * int(np.prod(q.shape[:-1])) * k.shape[-2] * q.shape[-1]
        return total

    def facts(self) -> dict:
        """The backend's name and choices, as they are after the choices were handed over."""
        return self.backend.facts() if DEVICE == "cuda" else self.built.backend_facts

    def profile(self) -> dict:
        if DEVICE == "cpu":  # a smoke run's CPU interpreter times no steps of its own
            return {}
        micro = self.built.program.training.micro
        return self.backend.profile(micro, self.micro_inputs())


ATTENTION_PRODUCTS = {"attention_core": 2, "attention_grad_q": 2, "attention_grad_kv": 2}  # products of width E


@dataclass(frozen=True)
class Peer:
    """How a PyTorch peer is written: compiled or eager, autocast to bf16 or float32,
    attention through SDPA with the fused AdamW (today's idiom) or written out (the earlier peer)."""

    compiled: bool
    bf16: bool
    idiomatic: bool = True


PEERS = {
    "eager-f32": Peer(False, False), "compile-f32": Peer(True, False),
    "eager-bf16": Peer(False, True), "compile-bf16": Peer(True, True),
    "eager-f32-written": Peer(False, False, False), "compile-f32-written": Peer(True, False, False),
}
OURS = {"ours-f32": "f32", "ours-bf16": "bf16"}
# (ours, peer, goal): the ratios the issue sets; eager peers: peer/ours >= goal, compiled: ours/peer <= goal
GOALS = (("ours-f32", "eager-f32", 1.0), ("ours-f32", "compile-f32", 1.25), ("ours-bf16", "eager-bf16", 1.0),
         ("ours-bf16", "compile-bf16", 1.25), ("ours-f32", "eager-f32-written", 1.0),
         ("ours-f32", "compile-f32-written", 1.25))


def torch_step(name: str, options: dict, batch: int, peer: Peer):
    """One training step of the model in plain PyTorch, written as `peer` says."""
    import contextlib

    import torch

    import torch_models

    torch.manual_seed(0)
    model, optimizer, draw = PEER_MODELS[name](torch_models, options, batch, peer)
    forward = torch.compile(model) if peer.compiled else model
    precision = (lambda: torch.autocast(DEVICE, dtype=torch.bfloat16)) if peer.bf16 else contextlib.nullcontext

    def step():
        x, y = draw()
        optimizer.zero_grad(set_to_none=True)
        with precision():
            logits = forward(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if name != "cnn":  # the language models clip at 1.0, as their files say
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def language_model(torch_models, options: dict, batch: int, peer: Peer):
    import torch

    model = torch_models.CharLM(**options, sdpa=peer.idiomatic).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=peer.idiomatic or None)
    vocab, context = options["vocab"], options["context"]

    def draw():
        return (torch.randint(0, vocab, (batch, context), device=DEVICE),
                torch.randint(0, vocab, (batch, context), device=DEVICE))

    return model, optimizer, draw


def convolutional(torch_models, options: dict, batch: int, peer: Peer):
    """examples/cnn.sexp's network with Adam (fused) at its learning rate, on noise images:
    cudnn.benchmark is on for the peers (time_model), as a PyTorch user sets it for a CNN."""
    import torch

    size = options["size"]
    model = torch_models.CNN(options["width"], options["wide"], options["classes"]).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, fused=peer.idiomatic or None)

    def draw():
        return (torch.randn(batch, 1, size, size, device=DEVICE),
                torch.randint(0, options["classes"], (batch,), device=DEVICE))

    return model, optimizer, draw


PEER_MODELS = {"char-lm": language_model, "gpt-50m": language_model, "cnn": convolutional, SMOKE_MODEL: language_model}


def seconds_per_step(step, steps: int, warmup: int) -> float:
    import torch

    synchronize = torch.cuda.synchronize if DEVICE == "cuda" else lambda: None
    for _ in range(warmup):
        step()
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return (time.perf_counter() - started) / steps


def time_ours(path: Path, precision: str, steps: int, warmup: int, edits: dict | None = None) -> dict:
    ours = OurStep(path, precision, edits)
    started = time.perf_counter()
    seconds = seconds_per_step(ours, steps, warmup)
    return {"seconds": seconds, "first": time.perf_counter() - started, "profile": ours.profile(),
            "products": ours.chosen_products(),
            "tflops": ours.product_flops() / seconds / 1e12, "facts": ours.facts()}


def time_model(name: str, rows: list, steps: int, warmup: int) -> dict:
    """{row: {"seconds", ...}} for one model; our rows first: the first sets cuBLAS's
    workspace before cuBLAS starts."""
    import torch

    path, options, batch = {**MODELS, **SMOKE_MODELS}[name]
    edits = smoke.TINY_CHAR_LM if name == SMOKE_MODEL else None
    timed = {row: time_ours(path, OURS[row], steps, warmup, edits) for row in rows if row in OURS}
    torch.use_deterministic_algorithms(False)  # the peers are plain PyTorch (TF32 stays off)
    benchmark, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, True
    for row in rows:
        if row in PEERS:
            timed[row] = {"seconds": seconds_per_step(torch_step(name, options, batch, PEERS[row]), steps, warmup)}
    torch.backends.cudnn.benchmark = benchmark
    torch.use_deterministic_algorithms(True)
    return timed


def report(name: str, timed: dict, steps: int, warmup: int) -> None:
    print(f"{name}: {steps} timed steps after {warmup} warm-up steps, TF32 off")
    for row, found in timed.items():
        extra = f"  {found['tflops']:.1f} TFLOP/s in products ({found['products']})" if "tflops" in found else ""
        print(f"  {row:<20}{found['seconds'] * 1e3:>10.2f} ms{extra}")
    for ours, peer, goal in GOALS:
        if ours in timed and peer in timed:
            mine, theirs = timed[ours]["seconds"], timed[peer]["seconds"]
            ratio, text = (theirs / mine, "peer/ours") if not PEERS[peer].compiled else (mine / theirs, "ours/peer")
            met = ratio >= goal if not PEERS[peer].compiled else ratio <= goal
            print(f"  {ours} vs {peer}: {text} {ratio:.2f} (goal {'>=' if not PEERS[peer].compiled else '<='} "
                  f"{goal}) {'met' if met else 'NOT met'}")
    for row in OURS:
        if row in timed:
            seconds = timed[row]["profile"]
            total = sum(seconds.values())
            parts = ", ".join(f"{kind} {value * 1e3:.2f} ms ({value / total:.0%})"
                              for kind, value in sorted(seconds.items(), key=lambda item: -item[1])) or "not profiled"
            print(f"  {row} profiled microbatch: {parts}; first {warmup + steps} steps with compilation "
                  f"{timed[row]['first']:.1f} s")


def smoke_settings(args) -> None:
    """--smoke's model, steps and rows; the CPU where there is no GPU."""
    global DEVICE
    args.models, args.steps, args.warmup = SMOKE_MODEL, 1, 0
    args.rows = args.rows or ",".join(row for row in [*OURS, *PEERS] if row in OURS or not PEERS[row].compiled)
    smoke.skipped("the torch.compile rows", "compiling takes a minute even for a tiny model")
    if not smoke.gpu():
        DEVICE = "cpu"
        smoke.skipped("the CUDA backend (the CPU interpreter stands in for it; the peers run on the CPU)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rows", default=None, help="which rows to time (default: all; --quick: all but compile-f32-written)")
    parser.add_argument("--quick", action="store_true", help="gpt-50m only, 5 steps after 2 warm-up steps")
    smoke.add_option(parser)
    args = parser.parse_args()
    if args.smoke:
        smoke_settings(args)
    if args.quick:
        args.models, args.steps, args.warmup = "gpt-50m", 5, 2
    if args.rows is None:
        args.rows = ",".join(row for row in [*OURS, *PEERS] if not (args.quick and row == "compile-f32-written"))
    rows = args.rows.split(",")
    unknown = [row for row in rows if row not in OURS and row not in PEERS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}: the rows are {', '.join([*OURS, *PEERS])}")
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import torch

    results = {name: time_model(name, rows, args.steps, args.warmup) for name in args.models.split(",")}
    facts = next((found["facts"] for timed in results.values() for found in timed.values() if "facts" in found), None)
    if facts:
        print(facts["name"])
        print("choices:", facts["choices"])
    print(f"torch {torch.__version__}")
    for name, timed in results.items():
        report(name, timed, args.steps, args.warmup)


if __name__ == "__main__":
    main()
