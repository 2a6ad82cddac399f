"""`:arithmetic exact` as a graph transformation, and where it keeps gradients unrounded.

    exact_graph(graph) -> Graph                # the graph as an exact run computes it (E-EXACT-002)
    gradient_sums(update) -> GradientSums      # the graphs a step adds and rounds its gradients with

Under `:arithmetic exact` every sum is exact and rounded once. `exact_graph` says so in the
graph itself (graph/core/ops.py, "Exact arithmetic"), so a backend needs no mode: float32
attention is written out as its composition (graph/passes/decomposed.py); the nodes of
the gradient region below get dtype acc, exact sums not rounded; every other node whose op
sums, or whose exact rule differs (maxima with the interpreter's zeros and NaN, checked ids),
gets the attribute exact=True: its op's exact form, each sum rounded once. Backends compute
them with their exact rule tables. The compile applies it to every graph of an exact run
(graph/training/program.py).

A parameter's gradient is a sum over the batch, and a step adds it over microbatches (and a
stacked call over several at once, and later the processes): those sums are one sum only if
nothing is rounded between a batch reduction and the end of the step. So the nodes from
each `grad/<path>` output back to the reductions that sum over the records are acc, found
backwards from every `grad/` output:

- a REDUCING node (matmul, sum, scatter_add, conv2d_weight_grad) ends the walk: it is
  computed as an accumulator from ordinary rounded inputs;
- a CARRYING node (add, reshape, transpose) is exact on accumulators (digits add as
  integers; movement moves digits), so the walk goes on through its inputs;
- a `const` (the zero gradient of an unused parameter) becomes an exact accumulator;
- anything else (a mul, a cast, a division) would round inside the sum: E-EXACT-002.

Every reader of a region node must be in the region too (or read it as an output), since
the region's values exist only as digits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.core.ir import Attrs, Graph, Node
from sexpgpu.graph.core.ops import ACC
from sexpgpu.graph.passes.decomposed import composed_attention

REDUCING = ("matmul", "sum", "scatter_add", "conv2d_weight_grad")
CARRYING = ("add", "reshape", "transpose")
ROLES = REDUCING + CARRYING + ("const",)  # the ops of a gradient region
# ops whose exact form is not their float one: they sum, take maxima by the interpreter's
# rule for zeros and NaN, or read ids that a device must check first
EXACT_FORMS = ("matmul", "sum", "max", "softmax", "log_softmax", "layernorm", "cross_entropy", "gather", "scatter_add",
               "conv2d", "conv2d_input_grad", "conv2d_weight_grad", "avg_pool2d", "avg_pool2d_grad", "max_pool2d",
               "max_pool2d_grad", "max_pool2d_pick", "attention_core", "attention_grad_q", "attention_grad_kv")
EXACT = Attrs({"exact": True})


def gradient_region(graph) -> set:
    """The nodes between a parameter's batch reductions and its `grad/` output; empty for a
    graph without gradients. E-EXACT-002 where one would round."""
    region: set = set()
    for name, output in graph.outputs.items():
        if name.startswith("grad/"):
            _walk(output, name, region)
    _check_readers(graph, region)
    return region


def exact_graph(graph: Graph) -> Graph:
    """The graph as `:arithmetic exact` computes it (above); E-EXACT-002 at the op where a
    gradient cannot stay exact."""
    graph = composed_attention(graph)
    region = gradient_region(graph)
    made: dict = {}
    for node in graph.nodes:
        inputs = tuple(made[source] for source in node.inputs)
        if node in region:
            made[node] = replace(node, dtype=ACC, inputs=inputs)
        elif node.op in EXACT_FORMS:
            made[node] = replace(node, inputs=inputs, attrs=Attrs({**node.attrs, **EXACT}))
        else:
            made[node] = node if inputs == node.inputs else replace(node, inputs=inputs)
    return Graph(dict(graph.inputs), {name: made[node] for name, node in graph.outputs.items()},
                 tuple(made[node] for node in graph.nodes))


def is_exact(node) -> bool:
    """Whether a backend computes the node by its exact rules: an exact form, or acc in or out."""
    return node.attrs.get("exact", False) or on_acc(node)


def on_acc(node) -> bool:
    """Whether the node makes or reads acc values: its rule is in a backend's acc table."""
    return node.dtype == ACC or any(source.dtype == ACC for source in node.inputs)


def _walk(output, name: str, region: set) -> None:
    stack = [output]
    while stack:
        node = stack.pop()
        if node in region:
            continue
        if node.op not in ROLES:
            raise SexpgpuError(
                "E-EXACT-002", f"under :arithmetic exact the gradient {name} must stay exact from its sums over the batch to the "
                f"step's end, but it passes through the op '{node.op}' (in {node.name or 'the model'}), which rounds; "
                f"only {', '.join(CARRYING)} may lie between a parameter's sums ({', '.join(REDUCING)}) and its "
                "gradient. Run this file with :arithmetic float.", node.loc)
        region.add(node)
        if node.op in CARRYING:
            stack.extend(node.inputs)


def _check_readers(graph, region: set) -> None:
    for reader in graph.nodes:
        if reader in region:
            continue
        for source in reader.inputs:
            if source in region:
                raise SexpgpuError(
                    "E-EXACT-002", f"under :arithmetic exact a parameter's gradient sum ({source.op} in "
                    f"{source.name or 'the model'}) is kept unrounded until the step's end, but the op '{reader.op}' "
                    "reads it as a rounded value. Run this file with :arithmetic float.", reader.loc)


# --- a step's sums across its calls ------------------------------------------------------------


@dataclass(frozen=True)
class GradientSums:
    """An exact step's graphs from the microbatch graph's acc `grad/<path>` to the update's f32
    ones: `accumulate` (`total/grad/<path>` + `grad/<path>` -> `grad/<path>`, exactly) and
    `rounding` (acc -> f32, once). The sum across processes lies between them (distributed/world.py)."""

    accumulate: Graph
    rounding: Graph


def gradient_sums(update: Graph) -> GradientSums:
    """The GradientSums of the gradients `update` reads."""
    shapes = {name: node.shape for name, node in update.inputs.items() if name.startswith("grad/")}
    totals = {f"total/{name}": _acc_input(f"total/{name}", shape) for name, shape in shapes.items()}
    grads = {name: _acc_input(name, shape) for name, shape in shapes.items()}
    sums = {name: Node("add", ACC, shape, (totals[f"total/{name}"], grads[name])) for name, shape in shapes.items()}
    accumulate = Graph({**totals, **grads}, sums, (*totals.values(), *grads.values(), *sums.values()))
    rounded = {name: Node("round", "f32", node.shape, (node,), Attrs({"dtype": "f32"})) for name, node in grads.items()}
    return GradientSums(accumulate, Graph(dict(grads), rounded, (*grads.values(), *rounded.values())))


def _acc_input(name: str, shape) -> Node:
    return Node("input", ACC, tuple(shape), attrs=Attrs({"name": name, "dtype": ACC, "shape": tuple(shape)}))
