"""The resolved experiment as JSON: what a run directory and a checkpoint store.

`experiment_to_json` gives the selected run with every default filled in, and the graphs it
reaches (its model, loss, generators, and the graphs those call), each with its inputs,
options and body as canonical text: one line a form, comments and spacing dropped, so that
editing a comment changes nothing here. Keys come in a fixed order; a non-finite float is
written as the string "inf" or "-inf" (JSON has no infinity).
"""

from __future__ import annotations

import math

from sexpgpu.lang.experiment import Call, DataSpec, Experiment, GraphDef, RunDef
from sexpgpu.lang.defrun import OPTIMIZERS
from sexpgpu.lang.syntax import SList, Symbol

FORMAT = "sexpgpu-experiment/1"


def experiment_to_json(experiment: Experiment) -> dict:
    run = experiment.run
    return {
        "format": FORMAT,
        "path": experiment.path,
        "source_sha256": experiment.source_sha256,
        "selection": experiment.selected,
        "run": run_to_json(run),
        "graphs": {name: graph_to_json(experiment.graphs[name]) for name in reached_graphs(experiment, run)},
    }


def run_to_json(run: RunDef) -> dict:
    optimizer = run.optimizer
    resolved = {
        "name": run.name,
        "seed": run.seed,
        "data": _data(run.data),
        "model": _call(run.model),
        "loss": {"kind": run.loss.kind, "fields": list(run.loss.fields),
                 "graph": _call(run.loss.graph) if run.loss.graph else None},
        "optimizer": {"kind": optimizer.kind, **{
            name: _plain(getattr(optimizer, name.replace("-", "_"))) for name in OPTIMIZERS[optimizer.kind].keys
        }},
        "schedule": {"kind": run.schedule.kind, "warmup": run.schedule.warmup, "min-lr": run.schedule.min_lr},
        "batch": run.batch,
        "microbatches": run.microbatches,
        "precision": run.precision,
        "steps": run.steps,
        "passes": [
            {"kind": spec.kind, "name": spec.name, "every": spec.every, "batches": spec.batches,
             "data": _data(spec.data) if spec.data else None}
            for spec in run.passes
        ],
        "checkpoint": None if run.checkpoint is None else {
            "every": run.checkpoint.every, "keep": run.checkpoint.keep, "to": run.checkpoint.to,
        },
    }
    if run.arithmetic != "float":  # only then: a float run's identity is what it always was
        resolved["arithmetic"] = run.arithmetic
    if run.diagnostics is not None:  # only then: an undiagnosed run's identity is what it always was
        resolved["diagnostics"] = {"every": run.diagnostics.every}
    return resolved


def graph_to_json(graph: GraphDef) -> dict:
    return {
        "kind": graph.kind,
        "inputs": list(graph.inputs),
        "options": {name: _plain(value) for name, value in graph.options.items()},
        "body": [str(form) for form in graph.body],
    }


def reached_graphs(experiment: Experiment, run: RunDef) -> list[str]:
    """The graphs `run` uses, directly or through calls in bodies, sorted by name."""
    pending = [call.name for call in _calls(run)]
    reached: set[str] = set()
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        reached.add(name)
        for symbol in _symbols(experiment.graphs[name].body):
            if symbol in experiment.graphs and symbol not in reached:
                pending.append(symbol)
    return sorted(reached)


def _calls(run: RunDef) -> list[Call]:
    calls = [run.model]
    if run.loss.graph is not None:
        calls.append(run.loss.graph)
    for data in [run.data] + [spec.data for spec in run.passes if spec.data is not None]:
        if data.generator is not None:
            calls.append(data.generator)
    return calls


def _symbols(forms) -> list[str]:
    """Every symbol in `forms`, at any depth (a stack, not recursion: bodies nest deep)."""
    names = []
    pending = list(forms)
    while pending:
        form = pending.pop()
        if isinstance(form, Symbol):
            names.append(form.name)
        elif isinstance(form, SList):
            pending.extend(form.items)
    return names


def _data(data: DataSpec) -> dict:
    if data.kind == "records":
        return {"kind": "records", "path": data.path, "shuffle": data.shuffle}
    if data.kind == "text":
        return {"kind": "text", "corpus": data.corpus, "context": data.context}
    return {"kind": "generator", "generator": _call(data.generator)}


def _call(call: Call) -> dict:
    return {
        "graph": call.name,
        "fields": list(call.args),
        "options": {name: _plain(value) for name, value in call.options.items()},
    }


def _plain(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value
