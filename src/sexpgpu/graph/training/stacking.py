"""Stacking: `degree` of a step's microbatches run as one batch of degree * :batch records.

    stack_training(training, degree) -> TrainingGraph   # its `micro` runs `degree` microbatches
    stack_generator(program, degree) -> Graph | None    # the generator at the same degree
    stacking_blockers(program) -> list[str]             # why the run cannot stack; [] when it can

The stacked microbatch graph is built again from the experiment with the batch `degree * B`
(so `batch` in the text, and every shape made from it, is the stacked batch), and then:

- its fields hold microbatches m, m+1, ..., m+degree-1 one after another on the first axis:
  records [j*B, (j+1)*B) are microbatch m+j;
- the loss is built once for each of those slices of the model's output and targets, exactly
  as the unstacked graph builds it for one microbatch (its draws renumbered alike), so output
  `loss` is the vector of the `degree` microbatch losses, f32[degree], in microbatch order;
- the gradients are the sum of the microbatches' gradients, as the run loop sums them
  unstacked: each microbatch's cotangent of the model output comes from its own loss (the
  unstacked graph's bits), the cotangents are concatenated, and the model's backward runs
  once over the stacked batch, summing over its records in another order (the only
  difference between a stacked and an unstacked step);
- a draw whose first axis is the stacked batch is `degree` copies of the unstacked draw on
  that axis (attribute `repeats`): element i draws the index i mod (its size / degree). An
  unsalted or :step-salted draw is the same in every microbatch of a step, so each stacked
  microbatch draws bit for bit what its own unstacked call draws.

That is sound only when no record sees another: the model graph must put the batch on the
first axis of every value that depends on a record and never combine records. This module
checks it by building the model at both batches and comparing them node for node; any
node that reduces its records to one value, whose op says it combines rows of the first
axis (its OpDef's `mixes_rows`, graph/core/ops.py), or whose shape does not scale on the
first axis alone, keeps the run unstacked, as do the
salts and generators that compile_program reports (a :microbatch, :records, :stage-records
or field salt, and a generator with bf16 nodes).
"""

from __future__ import annotations

import weakref
from dataclasses import replace

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.training.autodiff import gradients
from sexpgpu.graph.frontend.build import Builder
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ops import OPS, dims_text
from sexpgpu.graph.training.program import build_generator, loss_of, micro_graph, model_output


class StackingRefused(ValueError):
    """The graph cannot run its microbatches as one batch; `reasons` says why."""

    def __init__(self, reasons: list):
        super().__init__("; ".join(reasons))
        self.reasons = list(reasons)


def stack_training(training, degree: int):
    """The training graph whose `micro` runs `degree` consecutive microbatches as one call."""
    if degree == 1:
        return training
    if training.degree != 1:
        raise ValueError("stack_training takes the unstacked training graph")
    _check_degree(training.microbatches, degree)
    cache = _STACKED.setdefault(training.micro, {})
    if degree not in cache:
        cache[degree] = replace(training, micro=_stacked_micro(training.source, training.micro, degree), degree=degree)
    return cache[degree]


def stack_generator(program, degree: int):
    """The training generator at `degree` (None without one): its fields hold `degree`
    microbatches' records, each microbatch's what the unstacked generator gives it."""
    if program.generator is None or degree == 1:
        return program.generator
    cache = _STACKED.setdefault(program.generator, {})
    if degree not in cache:
        experiment = program.training.source
        batch = experiment.run.batch * degree
        graph, _ = _refusing(lambda: build_generator(experiment, experiment.run.data.generator, _maker(degree), batch),
                             "the generator", batch)
        reasons = _compare(program.generator.nodes, graph.nodes, degree, "the generator")
        if reasons:
            raise StackingRefused(reasons)
        cache[degree] = graph
    return cache[degree]


def stacking_blockers(program) -> list:
    """Why the run's microbatches cannot be stacked (empty when they can, at every degree
    that divides :microbatches)."""
    reasons = list(program.blockers)
    microbatches = program.training.microbatches
    if microbatches == 1:
        return reasons + ["the step has one microbatch"]
    if reasons:
        return reasons
    smallest = next(degree for degree in range(2, microbatches + 1) if microbatches % degree == 0)
    try:
        stack_training(program.training, smallest)
        stack_generator(program, smallest)
    except StackingRefused as refused:
        return refused.reasons
    return []


# --- the stacked microbatch graph -----------------------------------------------------------------

# an unstacked graph -> {degree: its stacked TrainingGraph (a micro graph) or Graph (a generator)}
_STACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_degree(microbatches: int, degree: int) -> None:
    if degree < 1 or microbatches % degree:
        raise ValueError(f"a stacking degree must divide :microbatches ({microbatches}); {degree} does not")


class _StackingBuilder(Builder):
    """A builder whose draws with the stacked batch on their first axis repeat per microbatch."""

    degree = 1
    repeating = True  # off while the per-microbatch loss is built

    def emit(self, op, *inputs, **attrs):
        if self.repeating and OPS[op].kind == "draw" and attrs["shape"] and attrs["shape"][0] == self.batch:
            attrs = dict(attrs, repeats=self.degree)
        return super().emit(op, *inputs, **attrs)

    def draw_counters(self) -> tuple:
        return dict(self._draws_in_scope), self._draws_in_graph

    def restore_draw_counters(self, counters: tuple) -> None:
        self._draws_in_scope, self._draws_in_graph = dict(counters[0]), counters[1]


def _refusing(build, what: str, batch: int):
    """build(), with an error of the larger build as the reason stacking is refused."""
    try:
        return build()
    except SexpgpuError as error:
        raise StackingRefused([f"{what} does not build with {batch} records: {error.message}"]) from None


def _maker(degree: int):
    def make(*args, **options):
        builder = _StackingBuilder(*args, **options)
        builder.degree = degree
        return builder

    return make


def _stacked_micro(experiment, micro, degree: int):
    run = experiment.run
    one = {name[len("field/"):]: (node.shape, node.dtype) for name, node in micro.inputs.items() if name.startswith("field/")}
    stacked = {name: ((shape[0] * degree,) + shape[1:], dtype) for name, (shape, dtype) in one.items()}
    reference = Builder(Emitter(), experiment.graphs, seed=run.seed, batch=run.batch, mode="model", training=True, fields=one)
    reference_output = model_output(experiment, reference)
    e = Emitter()
    builder = _maker(degree)(e, experiment.graphs, seed=run.seed, batch=run.batch * degree,
                                                  mode="model", training=True, fields=stacked)
    output = _refusing(lambda: model_output(experiment, builder), "the model", builder.batch)
    reasons = _compare(reference.e.nodes, e.nodes, degree, "the model")
    if not reasons and output.shape[:1] != (reference_output.shape[0] * degree,):
        reasons.append(f"the model's output {dims_text(output.shape)} does not hold the records on its first axis")
    if reasons:
        raise StackingRefused(reasons)
    model_nodes = len(e.nodes)
    losses, pieces = _microbatch_losses(experiment, builder, output, degree)
    own = [node.name or "top level" for node in e.nodes[model_nodes:]
           if any(source.op == "input" and source in builder.param_nodes.values() for source in node.inputs)]
    if own:
        raise StackingRefused([f"the loss reads parameters of its own (at '{own[0]}')"])
    with e.at(scope="", loc=run.loss.loc):
        # each microbatch's cotangent of the model output, from its own loss alone, then
        # the model's backward once over the stacked batch: the step's summed gradients
        cotangents = [gradients(e, loss, [piece])[0] for loss, piece in zip(losses, pieces)]
        seed = e("concat", *cotangents, axis=0)
        vector = e("concat", *[e("reshape", loss, shape=(1,)) for loss in losses], axis=0)
    return micro_graph(experiment, builder, output, vector, seed)


def _microbatch_losses(experiment, builder: _StackingBuilder, output, degree: int) -> tuple:
    """(the loss of each microbatch's slice, that slice of the model output), built as the
    unstacked graph builds them: with the batch of one microbatch and the draw counters
    where the model left them."""
    loss = experiment.run.loss
    e, one = builder.e, builder.batch // degree
    locs = loss.field_locs or (loss.loc,) * len(loss.fields)
    targets = [builder.field(name, loc) for name, loc in zip(loss.fields, locs)]
    counters = builder.draw_counters()
    builder.batch, builder.repeating = one, False
    losses, pieces = [], []
    for index in range(degree):
        builder.restore_draw_counters(counters)
        with e.at(scope="", loc=loss.loc):
            piece, *labels = [e("slice", node, axis=0, start=index * one, stop=(index + 1) * one) for node in [output] + targets]
            value, _ = loss_of(experiment, builder, piece, labels, metrics=False)
        losses.append(value)
        pieces.append(piece)
    builder.batch, builder.repeating = one * degree, True
    return losses, pieces


# --- does the graph keep each record to itself? ---------------------------------------------------

def _compare(reference: list, stacked: list, degree: int, what: str) -> list:
    """Reasons the stacked build is not `degree` copies of the reference on the first axis."""
    if len(reference) != len(stacked) or any(a.op != b.op for a, b in zip(reference, stacked)):
        return [f"{what} is another graph at a larger batch (it branches on the batch size)"]
    kinds = {}
    reasons = []
    for one, many in zip(reference, stacked):
        kind = _kind(one, many, degree)
        kinds[many] = kind
        where = f"{what}: {many.op} at '{many.name or 'top level'}'"
        if kind is None:
            reasons.append(f"{where} has shape {dims_text(one.shape)} for one microbatch and {dims_text(many.shape)} "
                           "stacked: the batch is not its first axis alone")
        elif kind == "stacked" and OPS[many.op].kind == "draw" and many.attrs.get("repeats") != degree:
            reasons.append(f"{where} is as long as the stacked batch without being drawn per record")
        elif kind == "shared" and many.attrs.get("repeats"):
            reasons.append(f"{where} has a first axis as long as the stacked batch that is not the batch")
        elif _mixes(many, [kinds[source] for source in many.inputs], kind):
            reasons.append(f"{where} combines records of different microbatches")
        if len(reasons) >= 3:
            break
    return reasons


def _kind(one, many, degree: int) -> str | None:
    if one.shape == many.shape:
        return "shared"
    if one.shape and many.shape == (one.shape[0] * degree,) + one.shape[1:]:
        return "stacked"
    return None


def _mixes(node, input_kinds: list, kind: str) -> bool:
    if "stacked" not in input_kinds:
        return False
    if kind == "shared":
        return True  # a value of the whole batch made from its records: a reduction across them
    rule = OPS[node.op].mixes_rows
    return rule is not None and rule(node, [input_kind == "stacked" for input_kind in input_kinds])
