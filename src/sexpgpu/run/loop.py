"""The run loop: one step is the microbatches in order, their gradients summed in order,
then the update. Passes and checkpoints follow the step that triggers them.

At a stacking degree k (plan/choices.py decides it) the loop runs the stacked training graph
once for each k consecutive microbatches, their fields concatenated along the batch axis.
When memory runs out in a stacked step, an unpinned run says `memory: allocation failed` and
computes unstacked from that step; a pinned one stops with the allocation error.

Under `:arithmetic exact` the program's GradientSums (graph/passes/exact_region.py) replace the
float sums across calls: each call's gradients are acc values, which the `accumulate` graph
adds exactly and the `rounding` graph rounds once before the update, on the backend like any
graph; the loss and metrics average as round(exact sum) / n (backends/exact_sums.py's `mean`).

On several processes (distributed/world.py) each runs its contiguous share of a step's microbatches,
by their global indices, and `across` combines the processes' sums before the update; one
process runs them all and combines nothing.

With `nonfinite` set (SEXPGPU_NONFINITE=stop, run/nonfinite.py) a step's losses are read,
every process's, before its update, and one that is NaN or infinite stops the run there
(E-NUM-001). A NaN or an infinity is a value here, never a numpy warning: a step and a pass
compute under np.errstate(all="ignore")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.passes.diagnosed import ACTIVATION, diagnosed_graph
from sexpgpu.distributed.world import OneProcess
from sexpgpu.run.allocation import allocation_failed_on_host
from sexpgpu.run.diagnosing import diagnosed_step, statistics
from sexpgpu.run.digest import parameters_digest
from sexpgpu.run.metrics import float_bits
from sexpgpu.run.nonfinite import first_nonfinite, first_nonfinite_value
from sexpgpu.run.schedule import learning_rate
from sexpgpu.run.state import TrainingState


@dataclass(frozen=True)
class Stacking:
    training: object  # TrainingGraph at this degree
    degree: int = 1
    pinned: bool = False  # a pinned run never falls back


class Trainer:
    """Drives a compiled program on a backend. It owns no policy about where output goes:
    `on_step`, `on_pass` and `on_checkpoint` callbacks receive each record."""

    def __init__(self, run, program, backend, feeder, stacking: Stacking | None = None, on_unstacked=None,
                 across=OneProcess):
        self.run = run
        self.program = program
        self.backend = backend
        self.feeder = feeder
        self.stacking = stacking or Stacking(program.training)
        self.sums = _sums_of(program.training.sums, backend)
        self.across = across  # how the step's sums combine across processes
        self.on_unstacked = on_unstacked  # called with the step from which the run computes unstacked
        self.diagnostics: dict | None = None  # the last step's diag record, on a diagnosed step
        self.nonfinite = None  # run/nonfinite.py's NonFiniteStop: a loss that is not finite stops the step
        self._diagnosed = None  # the diagnosed microbatch graph, made on the first diagnosed step

    def step(self, state: TrainingState) -> dict:
        """Apply step state.step + 1 and return its metrics record."""
        try:
            with np.errstate(all="ignore"):
                return self._step(state)
        except (MemoryError, SexpgpuError) as error:
            if not _allocation_failed(error) or self.stacking.degree == 1 or self.stacking.pinned:
                if isinstance(error, MemoryError):
                    raise allocation_failed_on_host(error, f"at step {state.step + 1}") from None
                raise
            self.backend.release(self.stacking.training.micro)  # the stacked graph's memory is the unstacked run's room
            self.stacking = Stacking(self.program.training)
            if self.on_unstacked is not None:
                self.on_unstacked(state.step + 1)
            with np.errstate(all="ignore"):
                return self._step(state)

    def _step(self, state: TrainingState) -> dict:
        step = state.step + 1
        micro, degree = self.stacking.training.micro, self.stacking.degree
        grads, losses = None, []
        share = self.across.share(self.run.microbatches)
        diagnosed = diagnosed_step(self.run, step) and 0 in share  # the process that runs microbatch 0
        # the update writes over the buffers it lent the last step: read what it compares first
        before = {path: self.backend.to_host(value) for path, value in state.params.items()} if diagnosed else {}
        first_outputs, last = {}, share.stop - degree
        for first in range(share.start, share.stop, degree):
            inputs = self._stacked_inputs(state, step, first, degree)
            if diagnosed and first == 0:
                outputs, first_outputs = self._diagnose(state, step, micro, inputs, degree)
            else:  # the last call's outputs are read before the next step's first call
                outputs = self.backend.run(micro, inputs, lent=first == last)
            losses.append(outputs["loss"])  # read after the update is queued (unless checked): no wait between them
            grads = self.sums.add(grads, {name: value for name, value in outputs.items() if name.startswith("grad/")})
        checked = self._finite_losses(state, step, losses) if self.nonfinite is not None else None
        lr = learning_rate(self.run.schedule, self.run.optimizer.lr, step, self.run.steps)
        update_inputs = dict(_prefixed("param/", state.params))
        update_inputs.update(self.sums.rounded(self.across.gradients(grads)))
        update_inputs.update(state.optimizer)
        update_inputs.update({"step": np.int32(step), "lr": lr})
        update = self.stacking.training.update
        # the parameters and state it returns are read until the next step's update, which they feed
        outputs = self.backend.run(update, _only(update, update_inputs), lent=True)
        state.params = {name[len("param/"):]: value for name, value in outputs.items() if name.startswith("param/")}
        state.optimizer = {name: value for name, value in outputs.items() if name.startswith("state/")}
        state.step = step
        loss = self.sums.mean(checked if checked is not None else self._gathered(losses))
        self.diagnostics = self._statistics(step, first_outputs, before, state.params) if diagnosed else None
        return {
            "step": step,
            "loss": float(loss),
            "loss_bits": float_bits(loss),
            "lr": float(lr),
            "grad_norm": float(self.backend.to_host(outputs["grad_norm"])),
            "digest": parameters_digest(self.backend, state.params),
        }

    def _gathered(self, losses: list) -> list:
        """The step's microbatch losses on the host, every process's, in global microbatch order."""
        return self.across.losses([part for value in losses for part in np.ravel(self.backend.to_host(value))])

    def _finite_losses(self, state: TrainingState, step: int, losses: list) -> list:
        """The gathered losses; E-NUM-001 when one is not finite, naming the first value of its
        microbatch, run again alone, that is not (every process raises it alike)."""
        gathered = self._gathered(losses)
        bad = first_nonfinite(gathered)
        if bad is None:
            return gathered
        found = first_nonfinite_value(self.backend, self.program.training.micro,
                                      self._micro_inputs(state, step, bad), step)
        raise self.nonfinite.loss_error(step, bad, gathered[bad], found)

    def _diagnose(self, state: TrainingState, step: int, micro, inputs: dict, degree: int) -> tuple:
        """(outputs of the first call, host outputs of the diagnosed graph on microbatch 0).
        Unstacked, the diagnosed graph is the first call; stacked, it runs besides it, on the
        first microbatch alone, and the step's own calls are as undiagnosed."""
        if self._diagnosed is None:
            self._diagnosed = diagnosed_graph(self.program.training.micro)
        if degree == 1:
            outputs = self.backend.run(self._diagnosed, inputs)
            diagnosed = outputs
        else:
            outputs = self.backend.run(micro, inputs)
            diagnosed = self.backend.run(self._diagnosed, self._micro_inputs(state, step, 0))
        grads = self.sums.rounded({name: value for name, value in diagnosed.items() if name.startswith("grad/")})
        host = {name: self.backend.to_host(value) for name, value in {**diagnosed, **grads}.items()
                if name.startswith(("grad/", ACTIVATION))}
        return {name: value for name, value in outputs.items() if not name.startswith(ACTIVATION)}, host

    def _statistics(self, step: int, first_outputs: dict, before: dict, after: dict) -> dict:
        """`before`: the parameters on the host before the step; `after`: on the backend."""
        host = self.backend.to_host
        return statistics(step, {name: value for name, value in first_outputs.items() if name.startswith("grad/")},
                          {name: value for name, value in first_outputs.items() if name.startswith(ACTIVATION)},
                          before, {path: host(value) for path, value in after.items()})

    def evaluate(self, state: TrainingState, pass_spec, name: str) -> dict:
        """One pass: the pass graph on `batches` batches, losses and metrics averaged in order."""
        with np.errstate(all="ignore"):
            return self._evaluate(state, pass_spec, name)

    def _evaluate(self, state: TrainingState, pass_spec, name: str) -> dict:
        graph = self.program.passes[name]
        totals: dict[str, list] = {}
        for batch_index in range(pass_spec.batches):
            # A pass graph that reads :step or :microbatch sees the step it follows and its batch.
            batch = self.feeder.eval_batch(pass_spec, name, state.step, batch_index)
            outputs = self.backend.run(graph, _call_inputs(graph, state, batch, state.step, batch_index))
            for key, value in outputs.items():
                totals.setdefault(key, []).append(self.backend.to_host(value))
        prefix = f"eval/{pass_spec.name}/" if pass_spec.name else "eval/"
        record = {"step": state.step}
        for key in sorted(totals):
            metric = key[len("metric/"):] if key.startswith("metric/") else key
            record[prefix + metric] = float(self.sums.mean(totals[key]))
        return record

    def _stacked_inputs(self, state: TrainingState, step: int, first: int, degree: int) -> dict:
        """The inputs of microbatches first .. first + degree - 1 as one batch: the feeder
        gives each field's records in microbatch order; `microbatch` is the first one's index."""
        return _call_inputs(self.stacking.training.micro, state, self.feeder.train_batch(step, first, degree), step, first)

    def call_inputs(self, state: TrainingState, first: int = 0) -> dict:
        """The inputs of the next step's call that starts at microbatch `first`, at this
        trainer's stacking degree: what a profile of one call runs."""
        return self._stacked_inputs(state, state.step + 1, first, self.stacking.degree)

    def first_inputs(self, state: TrainingState) -> dict:
        """The inputs of step 1's first microbatch: what a measurement at the first step runs."""
        return self._micro_inputs(state, 1, 0)

    def _micro_inputs(self, state: TrainingState, step: int, microbatch: int) -> dict:
        return _call_inputs(self.program.training.micro, state, self.feeder.train_batch(step, microbatch), step, microbatch)


def _allocation_failed(error: Exception) -> bool:
    """The host's MemoryError, or a backend's `memory: allocation failed` stop (E-MEM-001)."""
    return isinstance(error, MemoryError) or getattr(error, "code", None) == "E-MEM-001"


def _prefixed(prefix: str, values: dict) -> dict:
    return {prefix + name: value for name, value in values.items()}


def _only(graph, inputs: dict) -> dict:
    """The inputs a graph declares; a graph that does not read `microbatch` is not given it."""
    return {name: inputs[name] for name in graph.inputs}


def _call_inputs(graph, state: TrainingState, batch: dict, step: int, microbatch: int) -> dict:
    """What one call of a microbatch or pass graph reads: the parameters, a batch's fields,
    the step and the (first) microbatch's index."""
    inputs = {**_prefixed("param/", state.params), **batch, "step": np.int32(step), "microbatch": np.int32(microbatch)}
    return _only(graph, inputs)


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


@dataclass(frozen=True)
class Sums:
    """How a step adds what its calls return: gradients, then the loss and metrics."""

    add: Callable  # (total or None, the call's grad/ outputs) -> total
    rounded: Callable  # total -> the gradients the update graph reads
    mean: Callable  # [rounded values] -> np.float32


FLOAT_SUMS = Sums(_sum_in_order, lambda total: total, _mean_in_order)


def _sums_of(graphs, backend) -> Sums:
    """FLOAT_SUMS, or with an exact run's GradientSums, each sum a call of one of its graphs."""
    if graphs is None:
        return FLOAT_SUMS

    def add(total: dict | None, grads: dict) -> dict:
        return dict(grads) if total is None else backend.run(graphs.accumulate, {**_prefixed("total/", total), **grads})

    return Sums(add, lambda total: backend.run(graphs.rounding, total), _exact_mean)


def _exact_mean(values: list) -> np.float32:
    # torch is optional: an exact run's first call has needed it already (E-EXACT-001)
    from sexpgpu.backends.exact_sums import mean

    return mean(values)
