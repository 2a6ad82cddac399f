"""The CUDA backend's step time against the same models in plain PyTorch, on one GPU.

    PYTHONPATH=src python3 bench/bench_cuda.py [--steps N] [--models char-lm,gpt-50m]

For each model, in one process: the step time of `sexpgpu` on the CUDA backend (forward,
loss, gradients, the AdamW update with clipping), of the same model written in PyTorch
eager (bench/torch_models.py, torch.optim.AdamW, clip_grad_norm_), and of that model under
torch.compile. All three run float32 with TF32 off; the peers run without PyTorch's
deterministic-algorithms mode, as plain PyTorch does. Printed: the times, eager/ours (goal at
least 1.0: faster than eager), ours/compiled (goal at most 1.25), the TFLOP/s our products
reach, and the share of our step spent in products (cuBLAS), from one profiled step.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "char-lm": (ROOT / "examples" / "char-lm.sexp", dict(vocab=256, context=64, width=64, heads=4, ff=256, layers=2), 16),
    "gpt-50m": (ROOT / "bench" / "gpt-50m.sexp", dict(vocab=24576, context=512, width=512, heads=8, ff=2048, layers=8), 32),
}


class OurStep:
    """One training step of the experiment on the CUDA backend."""

    def __init__(self, path: Path):
        from sexpgpu.lang.forms import load_experiment
        from sexpgpu.run.setup import build_run

        self.experiment = load_experiment(str(path))
        self.built = build_run(self.experiment, "cuda")
        self.backend = self.built.backend
        self.state = self.built.initial_state()
        self.step_number = 0

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
        outputs = self.backend.run(training.micro, self.micro_inputs())
        updated = self.backend.run(training.update, self.update_inputs(outputs))
        self.state.params = {name[6:]: value for name, value in updated.items() if name.startswith("param/")}
        self.state.optimizer = {name: value for name, value in updated.items() if name.startswith("state/")}

    def product_flops(self) -> int:
        """Flops of the products of one step: 2 M N K for each, batches included."""
        total = 0
        for node in self.built.program.training.micro.nodes:
            if node.op == "matmul":
                total += 2 * int(np.prod(node.shape)) * node.inputs[0].shape[-1]
        return total

    def profile(self) -> dict:
        micro = self.built.program.training.micro
        return self.backend.profile(micro, self.micro_inputs())


def torch_step(options: dict, batch: int, compiled: bool):
    import torch

    import torch_models

    torch.manual_seed(0)
    model = torch_models.CharLM(**options).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    forward = torch.compile(model) if compiled else model
    vocab, context = options["vocab"], options["context"]

    def step():
        x = torch.randint(0, vocab, (batch, context), device="cuda")
        y = torch.randint(0, vocab, (batch, context), device="cuda")
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(forward(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def seconds_per_step(step, steps: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--peers", default="eager,compile", help="which PyTorch peers to time")
    args = parser.parse_args()
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import torch

    rows = []
    for name in args.models.split(","):
        path, options, batch = MODELS[name]
        ours = OurStep(path)  # first: it sets cuBLAS's workspace before cuBLAS starts
        facts = ours.backend.facts()
        started = time.perf_counter()
        ours_seconds = seconds_per_step(ours, args.steps, args.warmup)
        first = time.perf_counter() - started
        seconds = ours.profile()
        torch.use_deterministic_algorithms(False)  # the peers are plain PyTorch (TF32 stays off)
        peers = args.peers.split(",")
        eager = seconds_per_step(torch_step(options, batch, False), args.steps, args.warmup) if "eager" in peers else float("nan")
        compiled = seconds_per_step(torch_step(options, batch, True), args.steps, args.warmup) if "compile" in peers else float("nan")
        products = seconds.get("matmul", 0.0)
        torch.use_deterministic_algorithms(True)
        rows.append((name, ours_seconds, eager, compiled, ours.product_flops() / ours_seconds / 1e12,
                     products / sum(seconds.values()), seconds, first))
    print(facts["name"])
    print("choices:", facts["choices"])
    print(f"torch {torch.__version__}, {args.steps} timed steps after {args.warmup} warm-up steps, float32, TF32 off")
    header = f"{'model':<9}{'ours ms':>10}{'eager ms':>10}{'compile ms':>11}{'eager/ours':>11}{'ours/compile':>13}{'TFLOP/s':>9}{'GEMM share':>11}"
    print(header)
    for name, ours_seconds, eager, compiled, tflops, share, _, _ in rows:
        print(f"{name:<9}{ours_seconds * 1e3:>10.2f}{eager * 1e3:>10.2f}{compiled * 1e3:>11.2f}"
              f"{eager / ours_seconds:>11.2f}{ours_seconds / compiled:>13.2f}{tflops:>9.1f}{share:>11.0%}")
    for name, _, _, _, _, _, seconds, first in rows:
        parts = ", ".join(f"{kind} {value * 1e3:.2f} ms" for kind, value in sorted(seconds.items(), key=lambda item: -item[1]))
        print(f"{name} profiled eager microbatch step: {parts}; first {args.warmup + args.steps} steps with compilation {first:.1f} s")


if __name__ == "__main__":
    main()
