"""Microbatches for the run loop, from a data source or a generator graph.

Training microbatch m of step s reads global records starting at ((s-1)*M + m)*B. A pass's
batch b reads records starting at b*B of the pass's data (the run's own data when the pass
names none): the same records at every pass, so evaluations compare across steps.
A generator is run with step s and trip 0 for training, and trip b+1 for a pass's batch b;
a stacked call's k microbatches are the k*B records from its first microbatch's start, or
the generator stacked at degree k.
"""

from __future__ import annotations

import numpy as np

from sexpgpu.data.sources import open_source
from sexpgpu.graph.training.stacking import stack_generator


class Feeder:
    def __init__(self, run, backend):
        self.run = run
        self.program = None
        self.backend = backend
        self.sources = {}
        if run.data.kind != "generator":
            self.sources[None] = open_source(run.data, run.seed)
        for pass_spec in run.passes:
            if pass_spec.data is not None and pass_spec.data.kind != "generator":
                self.sources[pass_spec.name] = open_source(pass_spec.data, run.seed)

    def attach(self, program) -> None:
        """The compiled program, whose generator graphs produce generated data."""
        self.program = program

    def field_specs(self) -> dict | None:
        """{field: (shape of one record, dtype)} of the training data; None for a generator,
        whose fields the graph stage derives from the generator itself."""
        source = self.sources.get(None)
        if source is None:
            return None
        return {name: (spec.shape, spec.dtype) for name, spec in source.fields.items()}

    def identity(self) -> dict:
        if self.run.data.kind == "generator":
            return {"kind": "generator", "name": self.run.data.generator.name}
        return self.sources[None].identity

    def train_batch(self, step: int, microbatch: int, count: int = 1) -> dict:
        """The fields of `count` microbatches from `microbatch` on, one after another on the
        first axis (a stacked call's, graph/training/stacking.py)."""
        if self.run.data.kind == "generator":
            return self._generate(stack_generator(self.program, count), step, 0, microbatch)
        start = ((step - 1) * self.run.microbatches + microbatch) * self.run.batch
        return _as_fields(self.sources[None].batch(start, self.run.batch * count))

    def eval_batch(self, pass_spec, name: str, step: int, batch_index: int) -> dict:
        data = pass_spec.data or self.run.data
        if data.kind == "generator":
            graph = self.program.pass_generators.get(name, self.program.generator)
            return self._generate(graph, step, batch_index + 1, 0)
        source = self.sources.get(pass_spec.name if pass_spec.data is not None else None)
        return _as_fields(source.batch(batch_index * self.run.batch, self.run.batch))

    def _generate(self, graph, step: int, trip: int, microbatch: int) -> dict:
        inputs = {"step": np.int32(step), "trip": np.int32(trip), "microbatch": np.int32(microbatch)}
        # lent: the fields are copied into the call that reads them before the next batch is made
        outputs = self.backend.run(graph, {name: inputs[name] for name in graph.inputs}, lent=True)
        return {name: value for name, value in outputs.items() if name.startswith("field/")}


def _as_fields(batch: dict) -> dict:
    return {f"field/{name}": value for name, value in batch.items()}
