"""The program of a run: parameters, the training graph, passes and the generator.

    compile_program(experiment, field_specs=None) -> Program

`field_specs` is {field: (shape of one record, dtype)} of the run's data; a microbatch
prepends the batch axis. It may be None for generator data (the generator's own outputs
give them) and for the pydoc text source (x and y, int32 of the context length).

Graphs (inputs in this order; a scalar input appears only where the graph reads it):
- `training.micro`: param/<path> (path order), field/<name> (name order, the fields the model,
  loss and salts read), step, microbatch -> loss (the microbatch's mean loss, f32 scalar),
  grad/<path> (f32, path order).
- `training.update`: see optimizers.py.
- `passes[name]` (name: the pass's :name, or "eval"): the model and loss without dropout:
  param/<path>, field/<name>, step, microbatch -> loss and, for cross-entropy,
  metric/accuracy (the share of positions whose first largest logit is the label).
- `generator`: step, microbatch, trip -> field/<name> (in the order of its record form).
- `pass_generators[name]`: the generator of a pass whose :data is another generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.training.autodiff import gradients
from sexpgpu.graph.frontend.build import Builder
from sexpgpu.graph.frontend.records import Frame
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.passes.exact_region import exact_graph, gradient_sums
from sexpgpu.graph.core.ir import FLOAT_DTYPES, Node, dtype_named
from sexpgpu.graph.frontend.layers import cross_entropy_mean, mse
from sexpgpu.graph.core.ops import dims_text
from sexpgpu.graph.training.optimizers import build_update
from sexpgpu.graph.passes.precision import with_precision

SCALAR_INPUTS = ("step", "microbatch", "trip")


@dataclass(frozen=True)
class TrainingGraph:
    micro: object  # Graph
    update: object  # Graph
    state: dict  # slot -> [paths]: the optimizer state the update reads and writes
    microbatches: int
    degree: int = 1  # microbatches one call of `micro` runs as one batch (graph/training/stacking.py)
    source: object = field(default=None, compare=False, repr=False)  # the experiment stacking rebuilds from
    sums: object = None  # an exact run's GradientSums (graph/passes/exact_region.py); None: float sums in order

    @property
    def graphs(self) -> tuple:
        """The graphs a step runs: the microbatch graph, then the update."""
        return (self.micro, self.update)

    def state_shapes(self) -> dict:
        """{"state/<slot>/<path>": shape} in the update graph's input order."""
        return {name: node.shape for name, node in self.update.inputs.items() if name.startswith("state/")}


@dataclass(frozen=True)
class Program:
    params: dict  # path -> ParamSpec, sorted by path
    training: TrainingGraph
    passes: dict  # name -> Graph
    generator: object | None  # Graph
    blockers: tuple  # why the run cannot stack, found while compiling (graph/training/stacking.py adds the graph's own)
    field_specs: dict  # field -> (shape of one record, dtype): what the model was built for
    pass_generators: dict = field(default_factory=dict)  # pass name -> Graph

    @property
    def stackable(self) -> bool:
        return not self.blockers


def compile_program(experiment, field_specs: dict | None = None) -> Program:
    run = experiment.run
    generator, generator_builder = None, None
    if run.data.kind == "generator":
        generator, generator_builder = build_generator(experiment, run.data.generator)
    record_specs = _record_specs(run, run.data, field_specs, generator)
    micro, builder = build_micro(experiment, _microbatch_specs(record_specs, run.batch))
    params = dict(sorted(builder.params.items()))
    update, slots = build_update(params, run.optimizer, run.microbatches)
    update = in_arithmetic(run, update)
    passes, pass_generators = {}, {}
    for spec in run.passes:
        name = spec.name or "eval"
        specs = record_specs
        if spec.data is not None and spec.data.kind == "generator":
            pass_generators[name], _ = build_generator(experiment, spec.data.generator)
            specs = _record_specs(run, spec.data, None, pass_generators[name])
        elif spec.data is not None:
            specs = _record_specs(run, spec.data, field_specs, None)
        passes[name] = build_pass(experiment, name, _microbatch_specs(specs, run.batch))
    blockers = _blockers(builder, generator, generator_builder)
    sums = gradient_sums(update) if run.arithmetic == "exact" else None
    training = TrainingGraph(micro, update, slots, run.microbatches, source=experiment, sums=sums)
    return Program(params, training, passes, generator, blockers, record_specs, pass_generators)


def field_specs_of_generator(experiment, call=None) -> dict:
    """{field: (shape of one record, dtype)} that a generator call produces."""
    call = call or experiment.run.data.generator
    graph, _ = build_generator(experiment, call)
    return _generator_record_specs(graph, experiment.run.batch, call.loc)


# --- the graphs ----------------------------------------------------------------------------------


def build_micro(experiment, fields: dict):
    """(microbatch graph, its builder) for fields {name: (microbatch shape, dtype)}."""
    run = experiment.run
    e = Emitter()
    builder = Builder(e, experiment.graphs, seed=run.seed, batch=run.batch, mode="model", training=True, fields=fields)
    loss, _ = _model_and_loss(experiment, builder, metrics=False)
    return micro_graph(experiment, builder, loss, loss), builder


def micro_graph(experiment, builder: Builder, loss: Node, loss_output: Node, seed: Node | None = None):
    """The graph of `loss_output` (as output `loss`) and the gradient of `loss` (with the
    cotangent `seed`, autodiff.gradients) for each parameter, in path order, after the run's
    precision rewrote the forward nodes (precision.py)."""
    e = builder.e
    roots = [loss, loss_output] if seed is None else [loss, loss_output, seed]
    loss, loss_output, *rest = with_precision(e, experiment.run.precision, roots)
    seed = rest[0] if rest else None
    paths = sorted(builder.params)
    with e.at(scope="", loc=experiment.run.loss.loc):
        grads = gradients(e, loss, [builder.param_nodes[path] for path in paths], seed)
        grads = [grad if grad.dtype == "f32" else e("cast", grad, dtype="f32") for grad in grads]
    outputs = {"loss": loss_output}
    outputs.update({f"grad/{path}": grad for path, grad in zip(paths, grads)})
    return in_arithmetic(experiment.run, e.graph(_inputs(builder), outputs))


def build_pass(experiment, name: str, fields: dict):
    run = experiment.run
    e = Emitter()
    builder = Builder(e, experiment.graphs, seed=run.seed, batch=run.batch, mode="pass", draw_graph=name,
                      training=False, fields=fields)
    loss, metrics = _model_and_loss(experiment, builder, metrics=True)
    outputs = dict(zip(["loss", *metrics], with_precision(e, run.precision, [loss, *metrics.values()])))
    return in_arithmetic(run, e.graph(_inputs(builder), outputs))


def build_generator(experiment, call, make_builder=Builder, batch: int | None = None):
    """(generator graph, its builder) for a `(generator NAME ...)` call; `batch` (the run's
    unless given) and `make_builder` are stacking's (graph/training/stacking.py)."""
    run = experiment.run
    definition = experiment.graphs[call.name]
    e = Emitter()
    builder = make_builder(e, experiment.graphs, seed=run.seed, batch=batch or run.batch, mode="generator",
                           draw_graph=definition.name, training=True)
    with e.at(scope="", loc=call.loc):
        fields = builder.run_generator_body(definition, Frame(dict(call.options), "", definition.name))
    return in_arithmetic(run, e.graph(_inputs(builder), {f"field/{name}": node for name, node in fields.items()})), builder


def in_arithmetic(run, graph):
    """The graph as the run's `:arithmetic` computes it: under exact, graph/passes/exact_region.py's transformation."""
    return exact_graph(graph) if run.arithmetic == "exact" else graph


def _inputs(builder: Builder) -> dict:
    inputs = {f"param/{path}": builder.param_nodes[path] for path in sorted(builder.param_nodes)}
    inputs.update({f"field/{name}": builder.field_nodes[name] for name in sorted(builder.field_nodes)})
    inputs.update({name: builder.scalar_nodes[name] for name in SCALAR_INPUTS if name in builder.scalar_nodes})
    return inputs


def _model_and_loss(experiment, builder: Builder, metrics: bool):
    output = model_output(experiment, builder)
    loss = experiment.run.loss
    targets = [builder.field(name, loc) for name, loc in zip(loss.fields, _locs(loss.field_locs, loss, len(loss.fields)))]
    return loss_of(experiment, builder, output, targets, metrics)


def model_output(experiment, builder: Builder) -> Node:
    """The model's output on the builder's fields."""
    model = experiment.run.model
    arguments = [builder.field(name, loc) for name, loc in zip(model.args, _locs(model.arg_locs, model, len(model.args)))]
    with builder.e.at(scope="", loc=model.loc):
        output = builder.call(experiment.graphs[model.name], arguments, dict(model.options), "", model.loc)
    if not isinstance(output, Node):
        raise SexpgpuError("E-GRAPH-003", f"the model '{model.name}' gives a number, not a tensor.", model.loc)
    return output


def loss_of(experiment, builder: Builder, output: Node, targets: list, metrics: bool):
    """(the f32 scalar loss of `output` against `targets`, {metric name: node})."""
    loss = experiment.run.loss
    found = {}
    with builder.e.at(scope="", loc=loss.loc):
        if loss.kind == "cross-entropy":
            value = cross_entropy_mean(builder, output, targets[0])
            if metrics:
                found["metric/accuracy"] = _accuracy(builder, output, targets[0])
        elif loss.kind == "mse":
            value = mse(builder, output, targets[0])
        else:
            call = loss.graph
            value = builder.call(experiment.graphs[call.name], [output] + targets, dict(call.options), "", call.loc)
        value = _scalar_loss(builder, value, loss)
    return value, found


def _locs(locs, owner, count: int) -> tuple:
    return tuple(locs) if locs else (owner.loc,) * count


def _scalar_loss(builder: Builder, value, loss) -> Node:
    if not isinstance(value, Node) or value.shape != () or value.dtype not in FLOAT_DTYPES:
        found = f"{value.dtype} of shape {dims_text(value.shape)}" if isinstance(value, Node) else "a number"
        raise SexpgpuError("E-SHAPE-001", f"the loss must be a float scalar, found {found}.", loss.loc)
    return value if value.dtype == "f32" else builder.emit("cast", value, dtype="f32")


def _accuracy(builder: Builder, logits: Node, labels: Node) -> Node:
    guesses = builder.emit("argmax", logits, axis=logits.rank - 1)
    hits = builder.emit("cast", builder.emit("eq", guesses, labels), dtype="f32")
    total = builder.emit("sum", hits, axes=None, keep=False)
    return builder.emit("div", total, builder.const(max(hits.size, 1), dtype="f32"))


# --- field specs and stacking ---------------------------------------------------------------------


def _record_specs(run, data, given: dict | None, generator) -> dict:
    if generator is not None:
        return _generator_record_specs(generator, run.batch, data.loc)
    if given is not None:
        return {name: (tuple(int(dim) for dim in shape), dtype_named(dtype)) for name, (shape, dtype) in given.items()}
    if data.kind == "text":
        return {"x": ((data.context,), "i32"), "y": ((data.context,), "i32")}
    raise ValueError(f"compile_program needs field_specs for {data.kind} data: the data module reads them from the file")


def _microbatch_specs(record_specs: dict, batch: int) -> dict:
    return {name: ((batch,) + tuple(shape), dtype) for name, (shape, dtype) in record_specs.items()}


def _generator_record_specs(generator, batch: int, loc) -> dict:
    specs = {}
    for name, node in generator.outputs.items():
        field_name = name[len("field/"):]
        if node.rank == 0 or node.shape[0] != batch:
            raise SexpgpuError(
                "E-SHAPE-001",
                f"generator field :{field_name} has shape {dims_text(node.shape)}: its first axis must be "
                f"the batch ({batch} records).",
                node.loc or loc,
            )
        specs[field_name] = (node.shape[1:], node.dtype)
    return specs


UNSTACKABLE_SALTS = {
    "microbatch": "a draw is salted with :microbatch, which differs between the stacked microbatches",
    "records": "a draw reads :records, which differs between the stacked microbatches",
    "stage-records": "a draw reads :stage-records, which differs between the stacked microbatches",
}


def _blockers(builder: Builder, generator, generator_builder) -> tuple:
    """Why the run's microbatches cannot run as one batch, as far as the salts and the
    generator tell (determinism.md: "A generator makes no choice of its own")."""
    reasons = []
    for part in dict.fromkeys(builder.salts_read):
        if part in UNSTACKABLE_SALTS:
            reasons.append(f"the model or loss: {UNSTACKABLE_SALTS[part]}")
        elif part.startswith("field/"):
            reasons.append(f"the model or loss: a draw is salted with the field {part[len('field/'):]}, "
                           "which differs between the stacked microbatches")
    if generator is not None:
        for part in dict.fromkeys(generator_builder.salts_read):
            if part in UNSTACKABLE_SALTS:
                reasons.append(f"the generator: {UNSTACKABLE_SALTS[part]}")
        if any(node.dtype == "bf16" for node in generator.nodes):
            reasons.append("the generator has bf16 nodes")
    return tuple(reasons)
