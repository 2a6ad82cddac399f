"""The det-train demonstration: one 160-step training run, computed unsharded and 4-way K-sharded.

    PYTHONPATH=src python examples/det_train_demo.py [--steps 160] [--device cpu|cuda]

It needs PyTorch, the optional extra torch (pip install 'sexpgpu[torch]'); without it, it says
so and exits with status 2.

A two-layer tanh network learns a fixed random teacher. Each run is computed twice, once
with every product over its whole K and once with K cut into 4 uneven shards whose partial
products are summed. In float32 the shards round in another order, so the loss moves in its
last bits from the first step on. With DetLinear every sum is exact and rounded once, so the
loss difference is exactly zero at every step and the final weights are the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass

try:
    import torch
    import torch.nn.functional as F
except ImportError as missing:  # an install without the extra: a sentence, not a traceback
    print(f"error: examples/det_train_demo.py needs PyTorch, which cannot be imported here ({missing}). "
          "Install the optional extra: pip install 'sexpgpu[torch]'.", file=sys.stderr)
    sys.exit(2)

from sexpgpu.exact import DetLinear


@dataclass(frozen=True)
class Shape:
    batch: int
    inputs: int
    hidden: int
    outputs: int


SHAPES = {"cpu": Shape(32, 64, 64, 16), "cuda": Shape(256, 1024, 1024, 256)}
LEARNING_RATE = 0.05


def k_cuts(k: int) -> list[int]:
    """Where K is cut into 4 uneven shards."""
    return [k // 5, (9 * k) // 20, (4 * k) // 5]


def initial_parameters(shape: Shape, device) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    sizes = [(shape.hidden, shape.inputs), (shape.hidden,), (shape.outputs, shape.hidden), (shape.outputs,)]
    fan_ins = [shape.inputs, shape.inputs, shape.hidden, shape.hidden]
    return [((torch.rand(size, generator=generator) * 2 - 1) / fan_in**0.5).to(device) for size, fan_in in zip(sizes, fan_ins)]


def batches(shape: Shape, steps: int, device):
    """The same inputs and teacher targets for every run."""
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(shape.outputs, shape.inputs, generator=generator) / shape.inputs**0.5
    for _ in range(steps):
        x = torch.randn(shape.batch, shape.inputs, generator=generator)
        yield x.to(device), torch.sin(x @ teacher.T).to(device)


class Float32Mlp(torch.nn.Module):
    """The float32 run: each product over K, or the sum of its K-shards' products."""

    def __init__(self, parameters, sharded: bool):
        super().__init__()
        self.params = torch.nn.ParameterList([torch.nn.Parameter(p.clone()) for p in parameters])
        self.sharded = sharded

    def linear(self, x, weight, bias):
        if not self.sharded:
            return F.linear(x, weight, bias)
        bounds = [0, *k_cuts(x.shape[1]), x.shape[1]]
        pieces = [F.linear(x[:, a:b], weight[:, a:b]) for a, b in zip(bounds, bounds[1:])]
        return sum(pieces[1:], pieces[0]) + bias

    def forward(self, x):
        w1, b1, w2, b2 = self.params
        return self.linear(torch.tanh(self.linear(x, w1, b1)), w2, b2)


class DetMlp(torch.nn.Module):
    """The DetLinear run: the same network, every product exact, optionally from K-shards."""

    def __init__(self, parameters, shape: Shape, sharded: bool):
        super().__init__()
        device = parameters[0].device
        self.first = DetLinear(shape.inputs, shape.hidden, device=device,
                               k_shards=k_cuts(shape.inputs) if sharded else 1)
        self.second = DetLinear(shape.hidden, shape.outputs, device=device,
                                k_shards=k_cuts(shape.hidden) if sharded else 1)
        with torch.no_grad():
            for mine, given in zip(self.parameters(), parameters):
                mine.copy_(given)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def train(model: torch.nn.Module, shape: Shape, steps: int, device) -> tuple[list[float], list[float]]:
    """SGD steps; returns the float32 training loss of each step, and the same loss of the same
    outputs evaluated in float64, which does not round away differences in their last bits."""
    losses, losses_fp64 = [], []
    for x, target in batches(shape, steps, device):
        model.zero_grad()
        y = model(x)
        loss = (y - target).square().mean()
        loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= LEARNING_RATE * parameter.grad
        losses.append(loss.item())
        losses_fp64.append((y.detach().double() - target.double()).square().mean().item())
    return losses, losses_fp64


def flat_weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()


def run_demo(steps: int, device: str, shape: Shape) -> dict:
    """Train the four runs; returns per-step loss differences and the final weights of each."""
    parameters = initial_parameters(shape, device)
    runs = {
        ("float32", False): Float32Mlp(parameters, sharded=False),
        ("float32", True): Float32Mlp(parameters, sharded=True),
        ("DetLinear", False): DetMlp(parameters, shape, sharded=False),
        ("DetLinear", True): DetMlp(parameters, shape, sharded=True),
    }
    losses = {key: train(model, shape, steps, device) for key, model in runs.items()}
    weights = {key: flat_weights(model) for key, model in runs.items()}
    result = {}
    for kind in ("float32", "DetLinear"):
        (unsharded, unsharded_fp64), (sharded, sharded_fp64) = losses[(kind, False)], losses[(kind, True)]
        result[kind] = {
            "loss_differences": [abs(a - b) for a, b in zip(unsharded, sharded)],
            "loss_differences_fp64": [abs(a - b) for a, b in zip(unsharded_fp64, sharded_fp64)],
            "weights": (weights[(kind, False)], weights[(kind, True)]),
        }
    return result


def describe(kind: str, outcome: dict) -> str:
    differences, differences_fp64 = outcome["loss_differences"], outcome["loss_differences_fp64"]
    unsharded, sharded = outcome["weights"]
    relative = ((unsharded.double() - sharded.double()).norm() / unsharded.double().norm()).item()
    same_bytes = unsharded.numpy().tobytes() == sharded.numpy().tobytes()
    digests = {hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16] for w in (unsharded, sharded)}
    return (f"{kind:>9}: the float32 loss differs at {_count(differences)}, the loss evaluated in "
            f"float64 at {_count(differences_fp64)}; final weights differ by {relative:.3g} relative; "
            f"identical bytes: {same_bytes}; sha256 {' vs '.join(sorted(digests))}")


def _count(differences: list[float]) -> str:
    moved = sum(d != 0 for d in differences)
    return f"{moved} of {len(differences)} steps (largest {max(differences):.3g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--every", type=int, default=10, help="print every this many steps")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 run is plain float32
    shape = SHAPES[torch.device(args.device).type]
    print(f"{args.steps} steps on {args.device}: {shape}; K cut at {k_cuts(shape.inputs)} and {k_cuts(shape.hidden)}")
    result = run_demo(args.steps, args.device, shape)
    print("|loss unsharded - loss 4-way K-sharded|, the loss as trained (float32) and evaluated in float64")
    print(f"{'step':>5}  {'float32 run':>12} {'(fp64 eval)':>12}  {'DetLinear run':>14} {'(fp64 eval)':>12}")
    for step in range(args.steps):
        if step % args.every == 0 or step == args.steps - 1:
            row = [result[kind][column][step] for kind in ("float32", "DetLinear")
                   for column in ("loss_differences", "loss_differences_fp64")]
            print(f"{step + 1:>5}  {row[0]:>12.3g} {row[1]:>12.3g}  {row[2]:>14.3g} {row[3]:>12.3g}")
    for kind in ("float32", "DetLinear"):
        print(describe(kind, result[kind]))


if __name__ == "__main__":
    main()
