"""Syntax to a checked `Experiment`: every top-level form, every keyword, every reference.

    load_experiment(path, selection)  reads a file, checks it, and picks the run
    parse_experiment(data, path, sha)  checks what the reader produced (no run picked)
    select_run(experiment, selection)  picks the run: by name, or the only one

Definitions may come in any order: graphs are checked first, then runs, which refer to them.
Every error is a SexpgpuError with the location of the offending datum (docs/errors.md).
"""

from __future__ import annotations

import os
from dataclasses import replace

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.lang.experiment import Experiment
from sexpgpu.lang.defgraph import RESERVED, read_graph
from sexpgpu.lang.reader import read_source, read_text
from sexpgpu.lang.defrun import RunContext, read_run
from sexpgpu.lang.syntax import SList, Symbol, describe
from sexpgpu.lang.values import type_error

TOP_LEVEL_FORMS = ("defgraph", "defgenerator", "defrun")


def load_experiment(path, selection: str | None = None) -> Experiment:
    path = os.fspath(path)
    text, sha256 = read_source(path)
    return select_run(parse_experiment(read_text(text, path), path, sha256), selection)


def parse_experiment(data: list, path: str, source_sha256: str) -> Experiment:
    graphs: dict = {}
    run_forms: dict = {}
    for datum in data:
        head = _top_level_head(datum)
        name = _definition_name(datum)
        if head == "defrun":
            _check_unique(name, run_forms, "defrun", lambda form: form.loc)
            run_forms[name.name] = datum
        else:
            _check_unique(name, graphs, "definition", lambda graph: graph.loc)
            graphs[name.name] = read_graph(datum, name)
    context = RunContext(path, graphs)
    runs = {name: read_run(form, form.items[1], context) for name, form in run_forms.items()}
    return Experiment(path, graphs, runs, source_sha256)


def select_run(experiment: Experiment, selection: str | None) -> Experiment:
    names = list(experiment.runs)
    listed = ", ".join(names)
    if selection is None:
        if len(names) == 1:
            return replace(experiment, selected=names[0])
        if not names:
            raise SexpgpuError(
                "E-SELECT-003", f"{experiment.path} has no defrun: there is nothing to run.",
                hint="Add a (defrun NAME :seed ... ) form.",
            )
        raise SexpgpuError(
            "E-SELECT-002",
            f"{experiment.path} has {len(names)} runs ({listed}): name the one to run after the file.",
        )
    if selection not in experiment.runs:
        raise SexpgpuError(
            "E-SELECT-001",
            f"{experiment.path} has no defrun named '{selection}': its runs are {listed or 'none'}.",
            hint=did_you_mean(selection, names),
        )
    return replace(experiment, selected=selection)


def _top_level_head(datum) -> str:
    if not isinstance(datum, SList) or datum.head is None:
        raise SexpgpuError(
            "E-FORM-001",
            f"expected a top-level form ({', '.join(TOP_LEVEL_FORMS)} ...), found {describe(datum)}.",
            datum.loc,
        )
    if datum.head not in TOP_LEVEL_FORMS:
        raise SexpgpuError(
            "E-FORM-001",
            f"unknown top-level form '{datum.head}': expected {', '.join(TOP_LEVEL_FORMS)}.",
            datum.items[0].loc,
            did_you_mean(datum.head, TOP_LEVEL_FORMS),
        )
    return datum.head


def _definition_name(form: SList) -> Symbol:
    if len(form.items) < 2:
        raise SexpgpuError("E-FORM-009", f"({form.head}) needs a name: expected ({form.head} NAME ...).", form.loc)
    name = form.items[1]
    if not isinstance(name, Symbol):
        raise type_error("a symbol", f"the name of a {form.head}", name)
    if name.name in RESERVED:
        raise SexpgpuError(
            "E-FORM-015", f"'{name.name}' is a name the language reserves: choose another name for this {form.head}.",
            name.loc,
        )
    return name


def _check_unique(name: Symbol, defined: dict, what: str, location_of) -> None:
    if name.name in defined:
        raise SexpgpuError(
            "E-FORM-006",
            f"'{name.name}' is defined twice: a {what} of that name is already at {location_of(defined[name.name])}.",
            name.loc,
        )
