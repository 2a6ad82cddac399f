"""Where an exact run keeps its parameter gradients unrounded.

    gradient_region(graph) -> {node: role}     # raises ExactRegionError
    check_exact_gradients(graph)               # the same, as a coded error (E-EXACT-002)

Under `:arithmetic exact` every sum is exact and rounded once. A parameter's gradient is a
sum over the batch, and a step adds it over microbatches (and a stacked call over several
at once, and later the GPUs): those sums are one sum only if nothing is rounded between a
batch reduction and the end of the step. So the nodes from each `grad/<path>` output back
to the reductions that sum over the records travel as unrounded accumulators (digits,
sexpgpu.exact), and the run loop combines them exactly and rounds each gradient once.

The region is found backwards from every `grad/` output:

- a REDUCING node (matmul, sum, scatter_add, conv2d_weight_grad) ends the walk: it is
  computed as an accumulator from ordinary rounded inputs;
- a CARRYING node (add, reshape, transpose) is exact on accumulators (digits add as
  integers; movement moves digits), so the walk goes on through its inputs;
- a `const` (the zero gradient of an unused parameter) becomes an exact accumulator;
- anything else (a mul, a cast, a division) would round inside the sum: the graph is refused.

Every reader of a region node must be in the region too (or read it as an output), since
the region's values exist only as digits.
"""

from __future__ import annotations

from sexpgpu.errors import SexpgpuError

REDUCING = ("matmul", "sum", "scatter_add", "conv2d_weight_grad")
CARRYING = ("add", "reshape", "transpose")
SOURCES = ("const",)
ROLES = {**{op: "reduce" for op in REDUCING}, **{op: "carry" for op in CARRYING}, **{op: "const" for op in SOURCES}}


class ExactRegionError(ValueError):
    """A gradient passes through a node that cannot stay exact; `node` and `output` say where."""

    def __init__(self, message: str, node, output: str):
        super().__init__(message)
        self.node = node
        self.output = output


def gradient_region(graph) -> dict:
    """{node: "reduce" | "carry" | "const"} for the nodes between a parameter's batch
    reductions and its `grad/` output; empty for a graph without gradients."""
    region: dict = {}
    for name, output in graph.outputs.items():
        if name.startswith("grad/"):
            _walk(output, name, region)
    _check_readers(graph, region)
    return region


def check_exact_gradients(graph) -> None:
    """gradient_region(graph), refusing with E-EXACT-002 at the parameter's declaration."""
    try:
        gradient_region(graph)
    except ExactRegionError as refused:
        raise SexpgpuError("E-EXACT-002", str(refused), refused.node.loc) from None


def _walk(output, name: str, region: dict) -> None:
    stack = [output]
    while stack:
        node = stack.pop()
        if node in region:
            continue
        role = ROLES.get(node.op)
        if role is None:
            raise ExactRegionError(
                f"under :arithmetic exact the gradient {name} must stay exact from its sums over the batch to the "
                f"step's end, but it passes through the op '{node.op}' (in {node.name or 'the model'}), which rounds; "
                f"only {', '.join(CARRYING)} may lie between a parameter's sums ({', '.join(REDUCING)}) and its "
                "gradient. Run this file with :arithmetic float.", node, name)
        region[node] = role
        if role == "carry":
            stack.extend(node.inputs)


def _check_readers(graph, region: dict) -> None:
    for reader in graph.nodes:
        if reader in region:
            continue
        for source in reader.inputs:
            if source in region:
                raise ExactRegionError(
                    f"under :arithmetic exact a parameter's gradient sum ({source.op} in {source.name or 'the model'}) "
                    f"is kept unrounded until the step's end, but the op '{reader.op}' reads it as a rounded value. "
                    "Run this file with :arithmetic float.", reader, "")
