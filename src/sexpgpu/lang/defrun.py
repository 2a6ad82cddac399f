"""`defrun`: every keyword and every form inside it, each checked against its table.

The tables here are the reference for docs/language.md's `defrun` section: one per slot
(`RUN_KEYS`, `DATA_SOURCES`, `OPTIMIZERS`, `SCHEDULES`, `PASSES`, `CHECKPOINTS`, `DIAGNOSTICS`). A run
refers to graphs by name; `RunContext` holds the file's definitions to resolve them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.lang.calls import read_call, read_fields
from sexpgpu.lang.experiment import (
    CheckpointSpec,
    DataSpec,
    DiagnosticsSpec,
    LossSpec,
    OptimizerSpec,
    PassSpec,
    RunDef,
    ScheduleSpec,
)
from sexpgpu.lang.keywords import REQUIRED, Key, read_keys
from sexpgpu.lang.limits import DIM_MAX, MICROBATCHES_MAX, RECORDS_MAX, STEPS_MAX
from sexpgpu.lang.subforms import FormSpec, read_form
from sexpgpu.lang.syntax import Integer, SList, String, Symbol
from sexpgpu.lang.values import boolean, integer, number, one_of, string, type_error

SEED_MAX = 2**64 - 1
TEXT_CORPORA = ("pydoc",)
TEXT_FIELDS = ("x", "y")
BUILTIN_LOSSES = ("cross-entropy", "mse")
_DIM = integer(1, DIM_MAX, maximum_text="2^31-1")
_STEPS = integer(1, STEPS_MAX, maximum_text="2^31-1")
PRECISIONS = ("f32", "bf16")  # f32: as written; bf16: mixed precision (graph/passes/precision.py)
ARITHMETICS = ("float", "exact")  # float: folds in documented orders; exact: every sum exact, rounded once


@dataclass(frozen=True)
class RunContext:
    path: str  # the experiment file
    graphs: dict  # name -> GraphDef

    def resolve(self, path: str) -> str:
        """A path written in an experiment file: relative ones are joined to the file's folder;
        absolute paths and `s3://` addresses are taken as written."""
        if path.startswith("s3://") or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(os.path.dirname(self.path), path))


# --- data -----------------------------------------------------------------------------

def _records(values, form, context) -> DataSpec:
    return DataSpec("records", path=context.resolve(values["FILE"]), shuffle=values["shuffle"], loc=form.loc)


def _text(values, form, context) -> DataSpec:
    return DataSpec("text", corpus=values["CORPUS"], context=values["context"], loc=form.loc)


DATA_SOURCES = {
    "records": FormSpec(_records, (("FILE", string),), {"shuffle": Key(boolean, False, "true or false")}),
    "text": FormSpec(
        _text, (("CORPUS", one_of(*TEXT_CORPORA)),), {"context": Key(_DIM, REQUIRED, "a byte count")}
    ),
    "generator": FormSpec(lambda values, form, context: None),  # read by _data below: its keys are the graph's
}


def _data(value, label, context) -> DataSpec:
    if isinstance(value, SList) and value.head == "generator":
        if len(value.items) < 2:
            raise SexpgpuError("E-FORM-009", f"(generator ...) for {label} needs a name: expected (generator NAME).",
                               value.loc)
        call = read_call(value, value.items[1], value.items[2:], context.graphs, "defgenerator", label)
        return DataSpec("generator", generator=call, loc=value.loc)
    return read_form(value, DATA_SOURCES, label, "data source", context)


def data_fields(data: DataSpec, graphs: dict) -> tuple[str, ...] | None:
    """The record fields a data source provides, or None when only its file knows."""
    if data.kind == "text":
        return TEXT_FIELDS
    if data.kind == "generator":
        return graphs[data.generator.name].record_fields
    return None


# --- model and loss ---------------------------------------------------------------------

def _model(value, label, context):
    _expect_call(value, label)
    return read_call(value, value.items[0], value.items[1:], context.graphs, "defgraph", label)


def _loss(value, label, context) -> LossSpec:
    _expect_call(value, label)
    if value.head in BUILTIN_LOSSES:
        where = f"({value.head} ...)"
        symbols = read_fields(value, value.items[1:], where, 1, "LABELS")
        read_keys(value.items[2:], {}, where, value)
        return LossSpec(value.head, (symbols[0].name,), None, value.loc, (symbols[0].loc,))
    call = read_call(
        value, value.items[0], value.items[1:], context.graphs, "defgraph", label, inputs_taken=1,
        builtins=BUILTIN_LOSSES,
    )
    return LossSpec("graph", call.args, call, value.loc, call.arg_locs)


def _expect_call(value, label) -> None:
    if not (isinstance(value, SList) and value.head is not None):
        raise type_error("a call like (mlp x)", label, value)


# --- optimizer and schedule -------------------------------------------------------------

_UNIT = Key(number(0, 1, below=True), REQUIRED, "a number at least 0 and less than 1")


def _optimizer(kind: str):
    def build(values, form, context) -> OptimizerSpec:
        fields = {name.replace("-", "_"): value for name, value in values.items()}
        return OptimizerSpec(kind, loc=form.loc, **fields)

    return build


def _with(key: Key, default) -> Key:
    return replace(key, default=default)


_LR = {"lr": Key(number(0, above=True), REQUIRED, "a learning rate greater than 0")}
_CLIP = {"clip": Key(number(0, above=True, infinite=True), float("inf"), "a norm greater than 0, or inf")}
_ADAM = {
    **_LR,
    "beta1": _with(_UNIT, 0.9),
    "beta2": _with(_UNIT, 0.999),
    "eps": Key(number(0, above=True), 1e-8, "a number greater than 0"),
}
OPTIMIZERS = {
    "sgd": FormSpec(_optimizer("sgd"), keys={**_LR, **_CLIP}),
    "momentum": FormSpec(
        _optimizer("momentum"),
        keys={**_LR, "momentum": _with(_UNIT, 0.9), "nesterov": Key(boolean, False, "true or false"), **_CLIP},
    ),
    "adam": FormSpec(_optimizer("adam"), keys={**_ADAM, **_CLIP}),
    "adamw": FormSpec(
        _optimizer("adamw"), keys={**_ADAM, "weight-decay": Key(number(0), 0.01, "a number at least 0"), **_CLIP}
    ),
}

SCHEDULES = {
    "constant": FormSpec(lambda values, form, context: ScheduleSpec("constant", loc=form.loc)),
    "warmup": FormSpec(
        lambda values, form, context: ScheduleSpec("warmup", warmup=values["steps"], loc=form.loc),
        keys={"steps": Key(_STEPS, REQUIRED, "a step count")},
    ),
    "cosine": FormSpec(
        lambda values, form, context: ScheduleSpec(
            "cosine", warmup=values["warmup"], min_lr=values["min-lr"], loc=form.loc
        ),
        keys={
            "warmup": Key(integer(0, STEPS_MAX, maximum_text="2^31-1"), 0, "a step count"),
            "min-lr": Key(number(0), 0.0, "a learning rate at least 0"),
        },
    ),
}


# --- passes and checkpoints -------------------------------------------------------------

def _pass_name(value, label, context) -> str:
    if isinstance(value, (Symbol, String)):
        return str(value.name if isinstance(value, Symbol) else value.value)
    raise type_error("a name", label, value)


PASSES = {
    "eval": FormSpec(
        lambda values, form, context: PassSpec(
            "eval", values["every"], values["batches"], values["data"], values["name"], form.loc
        ),
        keys={
            "every": Key(_STEPS, REQUIRED, "a step count"),
            "data": Key(_data, None, "a data source"),
            "batches": Key(integer(1, MICROBATCHES_MAX, maximum_text="2^20"), 1, "a batch count"),
            "name": Key(_pass_name, None, "a name"),
        },
    ),
}


def _passes(value, label, context) -> tuple:
    if not isinstance(value, SList) or value.head is not None:
        raise type_error("a list of passes like ((eval :every 100))", label, value)
    passes = [(read_form(item, PASSES, label, "pass", context), item) for item in value.items]
    seen = {}
    for spec, item in passes:
        if spec.name in seen:
            what = f"named '{spec.name}'" if spec.name else "without a :name"
            raise SexpgpuError(
                "E-FORM-006",
                f"two passes {what} in {label}; the first is at {seen[spec.name]}: their eval/* metrics would clash.",
                item.loc,
                "Give each pass its own :name.",
            )
        seen[spec.name] = item.loc
    return tuple(spec for spec, _ in passes)


CHECKPOINTS = {
    "every": FormSpec(
        lambda values, form, context: CheckpointSpec(values["N"], values["keep"], values["to"], form.loc),
        arguments=(("N", _STEPS),),
        keys={
            "keep": Key(_STEPS, None, "a checkpoint count"),
            "to": Key(string, None, 'a folder or "s3://bucket/prefix"'),
        },
    ),
}


def _checkpoint(value, label, context) -> CheckpointSpec:
    if isinstance(value, Integer):
        return CheckpointSpec(_STEPS(value, label), loc=value.loc)
    spec = read_form(value, CHECKPOINTS, label, "checkpoint rule", context)
    if spec.to is not None:
        spec = replace(spec, to=context.resolve(spec.to))
    return spec


DIAGNOSTICS = {
    "every": FormSpec(lambda values, form, context: DiagnosticsSpec(values["N"], form.loc),
                      arguments=(("N", integer(1)),)),
}


def _diagnostics(value, label, context) -> DiagnosticsSpec:
    if isinstance(value, Integer):
        return DiagnosticsSpec(integer(1)(value, label), loc=value.loc)
    return read_form(value, DIAGNOSTICS, label, "diagnostics selection", context)


# --- the run ---------------------------------------------------------------------------

RUN_KEYS = {
    "seed": Key(integer(0, SEED_MAX, maximum_text="2^64-1"), REQUIRED, "an integer from 0 to 2^64-1"),
    "data": Key(_data, REQUIRED, "a data source like (text pydoc :context 64)"),
    "model": Key(_model, REQUIRED, "a call of a defgraph on record fields, like (mlp x)"),
    "loss": Key(_loss, REQUIRED, "a loss like (cross-entropy y)"),
    "optimizer": Key(
        lambda value, label, context: read_form(value, OPTIMIZERS, label, "optimizer", context),
        REQUIRED,
        "an optimizer like (adam :lr 1e-3)",
    ),
    "schedule": Key(
        lambda value, label, context: read_form(value, SCHEDULES, label, "schedule", context),
        ScheduleSpec(),
        "a schedule",
    ),
    "batch": Key(_DIM, REQUIRED, "a count of records per microbatch"),
    "microbatches": Key(integer(1, MICROBATCHES_MAX, maximum_text="2^20"), 1, "a count of microbatches per step"),
    "precision": Key(one_of(*PRECISIONS), "f32", "a precision, " + " or ".join(PRECISIONS)),
    "arithmetic": Key(one_of(*ARITHMETICS), "float", "an arithmetic, " + " or ".join(ARITHMETICS)),
    "steps": Key(_STEPS, REQUIRED, "a step count"),
    "passes": Key(_passes, (), "a list of passes"),
    "checkpoint": Key(_checkpoint, None, "a step count or (every N)"),
    "diagnostics": Key(_diagnostics, None, "a step count or (every N)"),
}


def read_run(form: SList, name: Symbol, context: RunContext) -> RunDef:
    """A checked `(defrun NAME :KEY VALUE ...)`."""
    where = f"defrun '{name.name}'"
    values = read_keys(form.items[2:], RUN_KEYS, where, form, context)
    run = RunDef(name=name.name, loc=form.loc, **values)
    _check_run(run, context)
    return run


def _check_run(run: RunDef, context: RunContext) -> None:
    for data in [run.data] + [spec.data for spec in run.passes if spec.data is not None]:
        _check_fields(run.model.args, run.model.arg_locs, data, "the model", context)
        _check_fields(run.loss.fields, run.loss.field_locs, data, "the loss", context)
    _check_records(run)
    _check_arithmetic(run)
    if run.schedule.min_lr > run.optimizer.lr:
        raise SexpgpuError(
            "E-FORM-011",
            f"the schedule's :min-lr {run.schedule.min_lr} is above the optimizer's :lr {run.optimizer.lr}.",
            run.schedule.loc,
        )


def _check_arithmetic(run: RunDef) -> None:
    """Exact sums are rounded once to their node's dtype; mixed precision rounds a product's
    float32 sum to bf16 and casts it back, a second rounding inside the sums exact mode owns."""
    if run.arithmetic == "exact" and run.precision != "f32":
        raise SexpgpuError(
            "E-FORM-011",
            f"defrun '{run.name}': :arithmetic exact computes in float32, and :precision {run.precision} "
            "rounds products to bf16; use :precision f32 with :arithmetic exact.",
            run.loc,
        )


def _check_records(run: RunDef) -> None:
    """The record numbers a run and its passes read, and a text source's byte offsets, must fit
    int64 (docs/language.md, "Limits")."""
    reads = [(run.steps * run.microbatches * run.batch, run.data, run.loc)]
    reads += [(spec.batches * run.batch, spec.data or run.data, spec.loc) for spec in run.passes]
    for records, data, loc in reads:
        if records * (data.context or 1) > RECORDS_MAX:
            unit = f" of {data.context} bytes" if data.context else ""
            raise SexpgpuError(
                "E-FORM-011",
                f"defrun '{run.name}' would read {records:,} records{unit} here: at most 2^62 records, or bytes "
                "of text, in all (:steps x :microbatches x :batch, or a pass's :batches x :batch).",
                loc,
            )


def _check_fields(fields, locs, data: DataSpec, reader: str, context: RunContext) -> None:
    provided = data_fields(data, context.graphs)
    if provided is None:
        return
    for field, loc in zip(fields, locs):
        if field not in provided:
            raise SexpgpuError(
                "E-FORM-014",
                f"{reader} reads the record field '{field}', which its data ({data.kind}) does not provide: "
                f"its fields are {', '.join(provided)}.",
                loc,
                did_you_mean(field, provided),
            )
