"""The CUDA backend's step time against the same models in plain PyTorch, on one GPU.

    PYTHONPATH=src python3 bench/bench_cuda.py [--models gpt-50m,gpt-124m] [--precisions f32,bf16]
                                               [--rows ours,ours-patterns-off,eager,compile,compile-deterministic]
                                               [--steps N] [--warmup N] [--results DIR] [--smoke]

For each model and precision, the step time (forward, loss, gradients, AdamW with clipping)
of each row, every row in a process of its own (bench/harness.py):

- `ours`: `sexpgpu` on the CUDA backend, the experiment as written (`f32`) or with
  `:precision bf16` (bf16 products summed in float32), with the machine's choices made as
  `sexpgpu run` makes them by default (run/choosing.py's `choose`) and cuDNN's pattern graphs
  on where the device has them (SEXPGPU_PATTERNS's default; nvidia-cudnn-frontend installed);
- `ours-patterns-off`: the same with SEXPGPU_PATTERNS=off, so that one run measures what the
  patterns bring (ours-patterns-off/ours, above 1 where they are faster); not a default row;
- `eager`: the model as a PyTorch user writes it today (bench/torch_models.py with
  F.scaled_dot_product_attention(is_causal=True), torch.optim.AdamW(fused=True),
  clip_grad_norm_), float32 or under torch.autocast(bfloat16), with PyTorch's defaults: no
  deterministic algorithms, bf16 reduced-precision reductions allowed, TF32 off for products
  as PyTorch ships; the CNN's peers set cudnn.benchmark, as a user does for a CNN;
- `compile`: the same model under torch.compile (default mode);
- `compile-deterministic`: the same under torch.compile with torch.use_deterministic_algorithms(True)
  and CUBLAS_WORKSPACE_CONFIG=:4096:8: what a PyTorch user pays for run-to-run determinism.

A peer's process never ran our device set-up, which turns torch's global flags to
determinism; each row records the flags it ran with. Printed: each row's time, its ratio
peer/ours (above 1: ours is faster) against the goal where there is one (at least 1.0 against
eager, 0.9 against torch.compile, 1.1 against torch.compile with deterministic algorithms), the TFLOP/s our products
reach and where our step's time goes (one profiled microbatch). A row that fails (torch.compile
missing, out of memory) is reported with its error and the others run. Written:
bench/results/bench_cuda-MODEL-PRECISION.json and .md, one pair for each model and precision.

Models: gpt-50m (bench/gpt-50m.sexp), gpt-124m (bench/gpt-124m.sexp: GPT-2 small's shape),
char-lm (examples/char-lm.sexp), cnn (examples/cnn.sexp). --smoke: char-lm cut to
milliseconds a step, one step after none, the ours, ours-patterns-off and eager rows
(bench/smoke.py); without a GPU the peers run on the CPU and the CPU interpreter stands in
for the CUDA backend (no profile), so only the lines' shape means anything.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

import harness
import smoke

ROOT = Path(__file__).resolve().parents[1]


class Model(NamedTuple):
    path: Path  # the experiment
    options: dict  # its peer's torch_models options
    batch: int
    edits: dict | None = None  # made to the file's text before it is read (smoke's tiny model)


MODELS = {
    "gpt-50m": Model(ROOT / "bench" / "gpt-50m.sexp",
                     dict(vocab=24576, context=512, width=512, heads=8, ff=2048, layers=8), 32),
    "gpt-124m": Model(ROOT / "bench" / "gpt-124m.sexp",
                      dict(vocab=50304, context=1024, width=768, heads=12, ff=3072, layers=12), 8),
    "char-lm": Model(ROOT / "examples" / "char-lm.sexp",
                     dict(vocab=256, context=64, width=64, heads=4, ff=256, layers=2), 16),
    "cnn": Model(ROOT / "examples" / "cnn.sexp", dict(size=12, width=8, wide=16, classes=2), 32),
}
DEFAULT_MODELS = ("gpt-50m", "gpt-124m")
SMOKE_MODEL = "char-lm-tiny"  # --smoke's: the file's edits are smoke.TINY_CHAR_LM
SMOKE_MODELS = {SMOKE_MODEL: Model(ROOT / "examples" / "char-lm.sexp", smoke.TINY_CHAR_LM_PEER, 2, smoke.TINY_CHAR_LM)}
PRECISIONS = ("f32", "bf16")
CUBLAS_DETERMINISTIC = ":4096:8"


@dataclass(frozen=True)
class Peer:
    """How a PyTorch peer runs: eager or under torch.compile, with PyTorch's defaults or with
    deterministic algorithms (and cuBLAS's fixed workspace)."""

    compiled: bool
    deterministic: bool
    goal: float | None  # peer/ours at least, where the issue sets one


PEERS = {"eager": Peer(False, False, 1.0), "compile": Peer(True, False, 0.9),
         "compile-deterministic": Peer(True, True, 1.1)}
OURS = "ours"
OUR_ROWS = {OURS: {}, "ours-patterns-off": {"SEXPGPU_PATTERNS": "off"}}  # our rows and their settings
ROWS = (*OUR_ROWS, *PEERS)
DEFAULT_ROWS = (OURS, *PEERS)


def every_model() -> dict:
    return {**MODELS, **SMOKE_MODELS}


class OurStep:
    """One training step of the experiment on the CUDA backend (or, in a smoke run without a
    GPU, on the CPU interpreter)."""

    def __init__(self, model: Model, precision: str = "f32", device: str = "cuda"):
        from dataclasses import replace

        from sexpgpu.lang.forms import load_experiment
        from sexpgpu.run.setup import build_run

        path = model.path
        experiment = smoke.edited_experiment(path, model.edits) if model.edits else load_experiment(str(path))
        run = replace(experiment.run, precision=precision)
        self.device = device
        self.experiment = replace(experiment, runs={**experiment.runs, run.name: run})
        self.built = build_run(self.experiment, device)
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
        return self.backend.facts() if self.device == "cuda" else self.built.backend_facts

    def profile(self) -> dict:
        if self.device == "cpu":  # a smoke run's CPU interpreter times no steps of its own
            return {}
        micro = self.built.program.training.micro
        return self.backend.profile(micro, self.micro_inputs())


ATTENTION_PRODUCTS = {"attention_core": 2, "attention_grad_q": 2, "attention_grad_kv": 2}  # products of width E


def torch_step(name: str, model: Model, precision: str, compiled: bool, device: str = "cuda"):
    """One training step of the model in plain PyTorch, as a user writes it today: SDPA, the
    fused AdamW (Adam for the CNN), bf16 autocast for `bf16`, torch.compile when `compiled`."""
    import contextlib

    import torch

    import torch_models

    torch.manual_seed(0)
    module, optimizer, draw = PEER_MODELS[name](torch_models, model, device)
    forward = torch.compile(module) if compiled else module
    autocast = (lambda: torch.autocast(device, dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext

    def step():
        x, y = draw()
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            logits = forward(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if name != "cnn":  # the language models clip at 1.0, as their files say
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()

    return step


def language_model(torch_models, model: Model, device: str):
    import torch

    module = torch_models.CharLM(**model.options, sdpa=True).to(device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-4, weight_decay=0.01, fused=True)
    vocab, context = model.options["vocab"], model.options["context"]

    def draw():
        return (torch.randint(0, vocab, (model.batch, context), device=device),
                torch.randint(0, vocab, (model.batch, context), device=device))

    return module, optimizer, draw


def convolutional(torch_models, model: Model, device: str):
    """examples/cnn.sexp's network with Adam (fused) at its learning rate, on noise images,
    with cudnn.benchmark on, as a PyTorch user sets it for a CNN."""
    import torch

    torch.backends.cudnn.benchmark = True
    options, size = model.options, model.options["size"]
    module = torch_models.CNN(options["width"], options["wide"], options["classes"]).to(device)
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01, fused=True)

    def draw():
        return (torch.randn(model.batch, 1, size, size, device=device),
                torch.randint(0, options["classes"], (model.batch,), device=device))

    return module, optimizer, draw


PEER_MODELS = {"char-lm": language_model, "gpt-50m": language_model, "gpt-124m": language_model,
               "cnn": convolutional, SMOKE_MODEL: language_model}


def seconds_per_step(step, steps: int, warmup: int, device: str = "cuda") -> float:
    import torch

    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    for _ in range(warmup):
        step()
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return (time.perf_counter() - started) / steps


# ---- in a row's own process


def time_row(spec: dict) -> dict:
    """One row of one model at one precision: its seconds a step and what it ran with."""
    import torch

    device = row_device(spec["smoke"])
    model = every_model()[spec["model"]]
    started = time.perf_counter()
    if spec["row"] in OUR_ROWS:
        step = OurStep(model, spec["precision"], device)
    else:
        peer = PEERS[spec["row"]]
        torch.use_deterministic_algorithms(peer.deterministic)
        step = torch_step(spec["model"], model, spec["precision"], peer.compiled, device)
    seconds = seconds_per_step(step, spec["steps"], spec["warmup"], device)
    found = {"seconds": seconds, "set_up_and_first_steps": time.perf_counter() - started - seconds * spec["steps"],
             "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
             "flags": harness.torch_flags()}
    if spec["row"] in OUR_ROWS:
        found.update(profile=step.profile(), products=step.chosen_products(), facts=step.facts(),
                     tflops=step.product_flops() / seconds / 1e12)
    return found


def row_device(smoking: bool) -> str:
    if smoke.gpu():
        return "cuda"
    if smoking:
        return "cpu"
    raise RuntimeError("no CUDA GPU here: bench_cuda times the CUDA backend and its peers on one")


# ---- in the parent process


def planned_rows(model: str, precision: str, rows: list[str], args) -> list[harness.Row]:
    spec = {"model": model, "precision": precision, "steps": args.steps, "warmup": args.warmup, "smoke": args.smoke}
    return [harness.Row(f"{model}/{precision}/{row}", {**spec, "row": row}, row_environment(row)) for row in rows]


def row_environment(row: str) -> dict:
    """cuBLAS's fixed workspace for the deterministic peer; none for the others, whatever the
    shell had (ours sets its own in its device set-up); our rows' settings."""
    if row in OUR_ROWS:
        return OUR_ROWS[row]
    return {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_DETERMINISTIC if PEERS[row].deterministic else None}


def report(model: str, precision: str, results: dict, args) -> harness.Report:
    """The table and ratios of one model at one precision; `results` by row."""
    print(f"\n{model} {precision}: {args.steps} timed steps after {args.warmup} warm-up steps, "
          "each row in its own process")
    ours = results.get(OURS)
    table, lines = [], []
    for row, result in results.items():
        table.append(table_row(row, result, ours))
        text = f"{result.found['seconds'] * 1e3:>10.2f} ms" if result.ok else f"FAILED: {result.error}"
        print(f"  {row:<24}{text}")
    for row, result in results.items():
        if row != OURS and result.ok and ours is not None and ours.ok:
            lines.append(ratio_line(row, result.found["seconds"] / ours.found["seconds"]))
    if ours is not None and ours.ok:
        lines += our_lines(ours.found, args.warmup + args.steps)
    for line in lines:
        print(f"  {line}")
    settings = {"steps": args.steps, "warm-up": args.warmup}
    return harness.Report(f"bench_cuda-{model}-{precision}", f"bench_cuda: {model}, {precision}",
                          list(results.values()), COLUMNS, table, lines, settings)


COLUMNS = ["row", "ms a step", "peer/ours", "goal", "deterministic algorithms", "bf16 reduced-precision reductions",
           "set-up and first steps (s)"]


def table_row(row: str, result, ours) -> list:
    if not result.ok:
        return [row, "failed", "", "", "", "", result.error]
    found, flags = result.found, result.found["flags"]
    ratio = (f"{found['seconds'] / ours.found['seconds']:.2f}"
             if row != OURS and ours is not None and ours.ok else "")
    goal = PEERS[row].goal if row in PEERS else None
    return [row, f"{found['seconds'] * 1e3:.2f}", ratio, "" if goal is None else f">= {goal}",
            on_off(flags["deterministic_algorithms"]), on_off(flags["bf16_reduced_precision_reduction"]),
            f"{found['set_up_and_first_steps']:.1f}"]


def on_off(flag: bool) -> str:
    return "on" if flag else "off"


def ratio_line(peer: str, ratio: float) -> str:
    goal = PEERS[peer].goal if peer in PEERS else None
    verdict = "" if goal is None else f" (goal >= {goal}: {'met' if ratio >= goal else 'NOT met'})"
    return f"ours vs {peer}: {peer}/ours {ratio:.2f}{verdict}"


def our_lines(found: dict, steps: int) -> list[str]:
    seconds = found["profile"]
    total = sum(seconds.values())
    parts = ", ".join(f"{kind} {value * 1e3:.2f} ms ({value / total:.0%})"
                      for kind, value in sorted(seconds.items(), key=lambda item: -item[1])) or "not profiled"
    facts = found["facts"]
    return [f"ours: {found['tflops']:.1f} TFLOP/s in products ({found['products']})",
            f"ours, one profiled microbatch: {parts}",
            f"ours: {facts.get('name', 'backend')}; choices: {facts.get('choices', 'none')}",
            f"ours: set-up and the first {steps} steps with compilation {found['set_up_and_first_steps']:.1f} s"]


def chosen(parser, text: str, known, what: str) -> list[str]:
    names = text.split(",")
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown {what} {', '.join(unknown)}: the {what} are {', '.join(known)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="warm-up steps before them, compilation included (default 5)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--rows", default=None, help=f"of {','.join(ROWS)}; default: {','.join(DEFAULT_ROWS)} "
                                                    "(--smoke: ours,ours-patterns-off,eager)")
    harness.add_options(parser)
    smoke.add_option(parser)
    args = parser.parse_args()
    if args.row:
        harness.answer(time_row, args.row)
        return
    if args.smoke:
        args.models, args.steps, args.warmup = SMOKE_MODEL, 1, 0
        args.rows = args.rows or f"{OURS},ours-patterns-off,eager"
        smoke.skipped("the torch.compile rows", "compiling takes a minute even for a tiny model")
        if not smoke.gpu():
            smoke.skipped("the CUDA backend (the CPU interpreter stands in for it; the peers run on the CPU)")
    elif not smoke.gpu():
        parser.error("this benchmark runs on a GPU: no CUDA GPU here (--smoke runs it on the CPU)")
    models = chosen(parser, args.models, list(every_model()), "models")
    precisions = chosen(parser, args.precisions, PRECISIONS, "precisions")
    rows = chosen(parser, args.rows or ",".join(DEFAULT_ROWS), ROWS, "rows")
    folder = harness.results_folder(args.results, args.smoke)
    for model in models:  # each group written when it is timed: one that runs out of time loses only itself
        for precision in precisions:
            done = harness.run_rows(__file__, planned_rows(model, precision, rows, args), args.row_timeout)
            results = dict(zip(rows, done))
            harness.write_results(report(model, precision, results, args), folder, args.smoke)


if __name__ == "__main__":
    main()
