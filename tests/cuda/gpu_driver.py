"""A run loop for the GPU tests that reads values back through the backend's `to_host`:
microbatches in order, their gradients summed left to right, then the update, as
run/loop.py does. It lets a test compare two runs' parameters and losses bit for bit.
`run_on_the_gpu` runs a file through the command line instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from sexpgpu.run.schedule import learning_rate

# The loss envelope between a CPU and a GPU run of one file: their sums run in different
# orders, so the trajectories part by rounding and the curves may wander apart. Each step's
# GPU loss stays within ENVELOPE_STEP of the CPU loss (relative), and the mean of the last
# ten steps within ENVELOPE_TAIL.
ENVELOPE_STEP = 0.10
ENVELOPE_TAIL = 0.05
ROOT = Path(__file__).resolve().parents[2]


def run_on_the_gpu(path, run_dir: Path) -> Path:
    """`sexpgpu run PATH --device cuda --run-dir RUN_DIR` in a fresh process; the run directory."""
    command = [sys.executable, "-m", "sexpgpu", "run", str(path), "--device", "cuda", "--run-dir", str(run_dir)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


def train(experiment, backend, steps: int):
    """(losses as float32 bits, final parameters as host arrays) after `steps` steps."""
    from sexpgpu.run.setup import build_run

    built = build_run(experiment, "cpu")
    built.backend = backend
    built.feeder.backend = backend
    state = built.initial_state()
    program, run = built.program, experiment.run
    micro, update = program.training.micro, program.training.update
    losses = []
    for step in range(1, steps + 1):
        grads, step_losses = None, []
        for microbatch in range(run.microbatches):
            inputs = {f"param/{path}": value for path, value in state.params.items()}
            inputs.update(built.feeder.train_batch(step, microbatch))
            inputs.update({"step": np.int32(step), "microbatch": np.int32(microbatch)})
            outputs = backend.run(micro, {name: inputs[name] for name in micro.inputs})
            step_losses.append(np.float32(backend.to_host(outputs["loss"])))
            found = {name: value for name, value in outputs.items() if name.startswith("grad/")}
            grads = found if grads is None else {name: grads[name] + found[name] for name in grads}
        inputs = {f"param/{path}": value for path, value in state.params.items()}
        inputs.update(grads)
        inputs.update(state.optimizer)
        inputs.update({"step": np.int32(step), "lr": learning_rate(run.schedule, run.optimizer.lr, step, run.steps)})
        outputs = backend.run(update, {name: inputs[name] for name in update.inputs})
        state.params = {name[len("param/"):]: value for name, value in outputs.items() if name.startswith("param/")}
        state.optimizer = {name: value for name, value in outputs.items() if name.startswith("state/")}
        total = np.float32(0)
        for value in step_losses:
            total = np.float32(total + value)
        losses.append(np.float32(total / np.float32(len(step_losses))))
    params = {path: backend.to_host(value) for path, value in state.params.items()}
    return np.array(losses, dtype=np.float32), params
