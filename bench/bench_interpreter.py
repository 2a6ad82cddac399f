"""The CPU interpreter's step time against the same models in PyTorch CPU eager.

    python bench/bench_interpreter.py [--steps N]

Both sides run forward, backward and the optimizer update on the same shapes, on this
machine's cores, in one process. The ratio is interpreter time / PyTorch time (goal: within
3x on tiny-adam)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from sexpgpu.lang.forms import load_experiment
from sexpgpu.run.loop import Trainer
from sexpgpu.run.setup import build_run

import torch_models

ROOT = Path(__file__).resolve().parents[1]


def interpreter_step_seconds(example: str, steps: int) -> float:
    experiment = load_experiment(str(ROOT / "examples" / example))
    built = build_run(experiment, "cpu")
    state = built.initial_state()
    trainer = Trainer(experiment.run, built.program, built.backend, built.feeder)
    trainer.step(state)  # warm-up: first-touch allocations
    started = time.perf_counter()
    for _ in range(steps):
        trainer.step(state)
    return (time.perf_counter() - started) / steps


def torch_step_seconds(model, optimizer, make_batch, loss_of, steps: int) -> float:
    def one_step():
        x, y = make_batch()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model(x), y)
        loss.backward()
        optimizer.step()

    one_step()
    started = time.perf_counter()
    for _ in range(steps):
        one_step()
    return (time.perf_counter() - started) / steps


def torch_tiny(steps: int) -> float:
    model = torch_models.MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    batch = lambda: (torch.randn(64, 2), torch.randint(0, 3, (64,)))
    return torch_step_seconds(model, optimizer, batch, torch.nn.functional.cross_entropy, steps)


def torch_char_lm(steps: int) -> float:
    model = torch_models.CharLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.01)
    batch = lambda: (torch.randint(0, 256, (16, 64)), torch.randint(0, 256, (16, 64)))

    def loss_of(logits, y):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))

    return torch_step_seconds(model, optimizer, batch, loss_of, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'model':<12}{'interpreter ms':>16}{'torch eager ms':>16}{'ratio':>8}")
    for name, example, peer in (("tiny-adam", "tiny-adam.sexp", torch_tiny),
                                ("char-lm", "char-lm.sexp", torch_char_lm)):
        ours = interpreter_step_seconds(example, args.steps)
        theirs = peer(args.steps)
        print(f"{name:<12}{ours * 1e3:>16.2f}{theirs * 1e3:>16.2f}{ours / theirs:>8.2f}")


if __name__ == "__main__":
    main()
