"""The run loop: one step is the microbatches in order, their gradients summed in order,
then the update. Passes and checkpoints follow the step that triggers them.

At stacking degree k (the plan's choice; graph/stacking.py) a step makes :microbatches / k
calls of the stacked microbatch graph, call c running microbatches c*k .. c*k+k-1 as one
batch. Each call gives the sum of its k microbatches' gradients, summed over calls left to
right, and the vector of its k microbatch losses, so the step's loss is the same mean of
the :microbatches losses in microbatch order. k = 1 is the unstacked step."""

from __future__ import annotations

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.stacking import stack_training
from sexpgpu.run.digest import parameters_digest
from sexpgpu.run.metrics import float_bits
from sexpgpu.run.schedule import learning_rate
from sexpgpu.run.state import TrainingState


class Trainer:
    """Drives a compiled program on a backend. It owns no policy about where output goes:
    `on_step`, `on_pass` and `on_checkpoint` callbacks receive each record."""

    def __init__(self, run, program, backend, feeder, degree: int = 1, on_allocation_failure=None):
        self.run = run
        self.program = program
        self.backend = backend
        self.feeder = feeder
        self.degree = degree  # microbatches a call runs as one batch, as the plan decided
        # called with the E-MEM-001 error when a stacked call cannot allocate; True: compute
        # unstacked from this step on (determinism.md, "losing level 1"), False: stop
        self.on_allocation_failure = on_allocation_failure

    def step(self, state: TrainingState) -> dict:
        """Apply step state.step + 1 and return its metrics record."""
        step = state.step + 1
        try:
            grads, losses = self._microbatches(state, step)
        except SexpgpuError as error:
            if error.code != "E-MEM-001" or self.degree == 1 or not self._unstack_after(error):
                raise
            grads, losses = self._microbatches(state, step)
        lr = learning_rate(self.run.schedule, self.run.optimizer.lr, step, self.run.steps)
        update_inputs = dict(_prefixed("param/", state.params))
        update_inputs.update(grads)
        update_inputs.update(state.optimizer)
        update_inputs.update({"step": np.int32(step), "lr": lr})
        outputs = self.backend.run(self.program.training.update, _only(self.program.training.update, update_inputs))
        state.params = {name[len("param/"):]: value for name, value in outputs.items() if name.startswith("param/")}
        state.optimizer = {name: value for name, value in outputs.items() if name.startswith("state/")}
        state.step = step
        loss = _mean_in_order([part for value in losses for part in np.ravel(self.backend.to_host(value))])
        return {
            "step": step,
            "loss": float(loss),
            "loss_bits": float_bits(loss),
            "lr": float(lr),
            "grad_norm": float(self.backend.to_host(outputs["grad_norm"])),
            "digest": parameters_digest(self.backend, state.params),
        }

    def evaluate(self, state: TrainingState, pass_spec, name: str) -> dict:
        """One pass: the pass graph on `batches` batches, losses and metrics averaged in order."""
        graph = self.program.passes[name]
        totals: dict[str, list] = {}
        for batch_index in range(pass_spec.batches):
            inputs = dict(_prefixed("param/", state.params))
            inputs.update(self.feeder.eval_batch(pass_spec, name, state.step, batch_index))
            # A pass graph that reads :step or :microbatch sees the step it follows and its batch.
            inputs.update({"step": np.int32(state.step), "microbatch": np.int32(batch_index)})
            outputs = self.backend.run(graph, _only(graph, inputs))
            for key, value in outputs.items():
                totals.setdefault(key, []).append(self.backend.to_host(value))
        prefix = f"eval/{pass_spec.name}/" if pass_spec.name else "eval/"
        record = {"step": state.step}
        for key in sorted(totals):
            metric = key[len("metric/"):] if key.startswith("metric/") else key
            record[prefix + metric] = float(_mean_in_order(totals[key]))
        return record

    def _microbatches(self, state: TrainingState, step: int) -> tuple:
        """(the step's gradients summed in microbatch order, each call's losses)."""
        micro = stack_training(self.program.training, self.degree).micro
        grads, losses = None, []
        for first in range(0, self.run.microbatches, self.degree):
            inputs = dict(_prefixed("param/", state.params))
            inputs.update(self.feeder.train_batch(step, first, self.degree))
            inputs.update({"step": np.int32(step), "microbatch": np.int32(first)})
            outputs = self.backend.run(micro, _only(micro, inputs))
            losses.append(outputs["loss"])  # read after the update is queued: no wait between them
            grads = _sum_in_order(grads, {name: value for name, value in outputs.items() if name.startswith("grad/")})
        return grads, losses

    def _unstack_after(self, error: SexpgpuError) -> bool:
        """Whether the step continues unstacked after a stacked call could not allocate."""
        if self.on_allocation_failure is None or not self.on_allocation_failure(error):
            return False
        release = getattr(self.backend, "release", None)
        if release is not None:  # the stacked graphs' memory is the unstacked run's room
            release(stack_training(self.program.training, self.degree).micro)
        self.degree = 1
        return True


def _prefixed(prefix: str, values: dict) -> dict:
    return {prefix + name: value for name, value in values.items()}


def _only(graph, inputs: dict) -> dict:
    """The inputs a graph declares; a graph that does not read `microbatch` is not given it."""
    return {name: inputs[name] for name in graph.inputs}


def _sum_in_order(total: dict | None, grads: dict) -> dict:
    """Microbatch gradients summed left to right: ((g0 + g1) + g2) + ..."""
    if total is None:
        return dict(grads)
    return {name: total[name] + grads[name] for name in total}


def _mean_in_order(values: list) -> np.float32:
    total = np.float32(0)
    for value in values:
        total = np.float32(total + np.float32(value))
    return np.float32(total / np.float32(len(values)))
