"""The fusion planner: which values a fused kernel recomputes instead of reading.

An elementwise node is not computed by a kernel of its own: its expression is inlined into
each kernel that reads it (a later elementwise kernel, a row or column reduction, a
normalisation). A node read by one kernel is therefore computed once, where it is read. A
node read by R kernels is recomputed by each of them only when that is cheaper than writing
it once and reading it back, by both measures, per element of the value:

- flops: its expression costs at most the policy's budget in flops per byte of the value
  (by default and under --deterministic 9 flops a byte, the spec's figure for an A100;
  otherwise the plan's measured one, plan/choices.py), unless R is 1;
- bytes: each recomputing reader loads the L bytes its expression loads (each distinct load
  counts the distinct elements it reads, so a bias broadcast along a long axis costs almost
  nothing), against a kernel that loads L and writes the value's S bytes, then R reads of
  S: recompute when R L <= L + S + R S (a tie recomputes: one kernel fewer);

and R is at most eight (each recomputing reader is one more kernel to compile). R counts
kernels, not direct readers: a reader that is itself inlined (a movement op, an elementwise
node) stands for its own kernel readers, so a node read by one elementwise node that three
kernels recompute is evaluated three times (`KernelReaders`). The count is made from the
graph alone: an elementwise reader is taken as inlined unless it will surely be written
out (then it is one reader): it has more than eight kernel readers, or it has several and
the value it reads already costs more flops than the budget allows it. Row
reductions that rowmerge.py later joins into one kernel still count apart, which errs
towards writing out. This is what writes the residual stream of a transformer out once
instead of re-adding every earlier branch in every kernel that reads it.

A value a reader sees broadcast to a larger shape (a per-row statistic, a scalar) is inlined
only when it costs at most 2 flops, since the broadcast would repeat its arithmetic for
every copy. Otherwise, or when a reader needs memory (a product, a gather, a copy, an
output of the graph), the node is written out by a fused elementwise kernel, which also
takes the other values of the same shape written out just before it, or by the row kernel
just before it (rowmerge.py).

What may fuse with the kernel before it, and why, is said where it is decided: a value
written out joins the open elementwise kernel of its space (`add_output`) or the open row
kernel (rowmerge.add_store), and a row kernel joins the row kernel before it
(rowmerge.merged); anything else starts a kernel of its own.

Recomputing keeps every node's rounding: the inlined expression is the node's own, in
float32 with the node's bf16 rounding, and no multiply-add is contracted (enable_fp_fusion
is off), so fusion decides where a value is computed, never what it is.

SEXPGPU_OPTIMIZE sets how much is fused:
  on  (default) inline as above, merge neighbouring elementwise kernels, capture CUDA graphs;
  off           every node is its own kernel and nothing is captured: the unfused lowering.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sexpgpu import settings
from sexpgpu.backends.cuda.codegen.expr import flops, map_leaves, nodes_in_order
from sexpgpu.backends.cuda.codegen.space import contiguous
from sexpgpu.backends.cuda.steps import FlatStep

MAX_FLAT_OUTPUTS = 8
# A fused expression deeper than this is written out: a chain of thousands of elementwise ops
# becomes kernels of at most this many levels each. Comparing, hashing and rewriting an
# expression recurse through its levels, and each node keeps its own rounding, so the split
# changes no bits.
MAX_FUSED_DEPTH = 32
BUDGET_FLOPS_PER_BYTE = 9.0
MAX_INLINE_NODES = 160  # a longer expression is written out, to bound compile time
MAX_RECOMPUTING_READERS = 8  # more kernel readers than this read the value back: each is a kernel to compile
BROADCAST_FLOPS = 2  # a value read broadcast to a larger shape is inlined only below this
VIEW_OPS = ("reshape", "transpose", "slice", "broadcast")


@dataclass(frozen=True)
class FusionPolicy:
    """How the backend lowers, as the plan decided it (plan/choices.py): the fusion level,
    the recompute budget in flops a byte (BUDGET_FLOPS_PER_BYTE under --deterministic and by
    default), {ProductShape.key(): implementation} for float32 products (products.py;
    a shape not named is ordinary), {ConvolutionKey.key(): engine text} for
    convolutions (windows.py; one not named runs PyTorch's cuDNN call), and the names of
    cuDNN's native pattern graphs on (backends/cuda/patterns.py; pattern_steps.py)."""

    level: str = "on"
    budget: float = BUDGET_FLOPS_PER_BYTE
    products: dict = field(default_factory=dict, hash=False)
    convolutions: dict = field(default_factory=dict, hash=False)
    patterns: tuple = ()

    def __post_init__(self):
        if not (0 < self.budget < float("inf")):
            raise ValueError(f"a recompute budget must be a positive number of flops a byte, not {self.budget}")

    @property
    def fuses(self) -> bool:
        return self.level == "on"


def policy_from_environment(budget: float = BUDGET_FLOPS_PER_BYTE, products: dict | None = None) -> FusionPolicy:
    """The policy of SEXPGPU_OPTIMIZE with the plan's recompute budget and products."""
    return FusionPolicy(settings.value("SEXPGPU_OPTIMIZE") or "on", budget, dict(products or {}))


class KernelReaders:
    """How many kernels evaluate a node that is inlined: its readers, where a movement op,
    or an elementwise reader (`inlinable(reader)`) that is itself inlined, stands for its
    own kernel readers, and a graph output is one more. Counted from the graph alone,
    before lowering: an elementwise reader is taken as inlined unless it will surely be
    written out (then it is one reader): when it has more than MAX_RECOMPUTING_READERS
    kernel readers, or, asked for a node whose value already costs more flops than the
    budget allows the reader (the reader's own expression contains that value), when it
    has more than one."""

    def __init__(self, graph, inlinable):
        self.consumers = graph.consumers()
        self.outputs = set(graph.outputs.values())
        self.inlinable = inlinable
        self.sinks: dict = {}
        for node in reversed(graph.nodes):
            self.sinks[node] = self._sinks(node, lambda reader: False)

    def count(self, node, writes_out=lambda reader: False) -> int:
        """Kernels evaluating `node`; `writes_out(reader)` says which elementwise readers
        the caller knows will be written out."""
        return len(self._sinks(node, writes_out))

    def _sinks(self, node, writes_out) -> set:
        found = {("output", node)} if node in self.outputs else set()
        for reader in self.consumers[node]:
            found |= self.sinks[reader] if self._passes(reader, writes_out) else {reader}
        return found

    def _passes(self, reader, writes_out) -> bool:
        if reader.op in VIEW_OPS:
            return True
        if not self.inlinable(reader) or reader in self.outputs:
            return False
        readers = len(self.sinks[reader])
        return readers <= MAX_RECOMPUTING_READERS and not (readers > 1 and writes_out(reader))


def loaded_bytes(value, size: int, item_bytes) -> float:
    """Bytes the expression loads per element of a value of `size` elements: each distinct
    load, the distinct elements its view reads (a stride-0 axis reads one) times the item
    size of its buffer (`item_bytes(key)`)."""
    total = 0.0
    size = max(int(size), 1)
    for node in nodes_in_order([value]):
        if node.op == "load":
            key, view = node.attr
            distinct = 1
            for dim, stride in zip(view.dims, view.strides):
                distinct *= int(dim) if stride else 1
            total += item_bytes(key) * min(distinct, size) / size
        elif node.op == "scalar":
            total += item_bytes(node.attr) / size
    return total


def broadcastable(policy: FusionPolicy, value, source_size: int, target_size: int) -> bool:
    """Whether a reader that sees the value broadcast to more elements may inline it: a
    broadcast repeats the value's arithmetic for every copy, so only a value that costs
    (almost) nothing is inlined so; any other is written out at its own size first."""
    return target_size <= source_size or flops([value]) <= BROADCAST_FLOPS


def recompute(policy: FusionPolicy, value, readers: int, itemsize: int, loads: float = 0.0) -> bool:
    """Whether each of `readers` kernels recomputes this value's expression, which loads
    `loads` bytes per element, rather than read it back."""
    if not policy.fuses:
        return False
    if len(nodes_in_order([value])) > MAX_INLINE_NODES:
        return False
    cost = flops([value])
    if cost == 0:  # a constant or a view: nothing to recompute
        return True
    if readers > MAX_RECOMPUTING_READERS:
        return False
    if readers <= 1:
        return True
    within_budget = cost <= policy.budget * itemsize
    return within_budget and readers * loads <= loads + itemsize + readers * itemsize


def add_output(step: FlatStep, shape, key: str, dtype: str, value) -> bool:
    """Whether the open elementwise kernel `step` takes `value` as one more output, and takes
    it. Legal when it is of the same space, has fewer than MAX_FLAT_OUTPUTS outputs, and
    `value` reads none of its outputs through another view or as a scalar: a read of an
    output through its own view becomes the output's expression (the kernel recomputes it
    rather than read what it writes), unless that makes it deeper than MAX_FUSED_DEPTH."""
    if step.shape != shape or len(step.outputs) >= MAX_FLAT_OUTPUTS:
        return False
    written = {key: (view, expression) for key, view, _, expression in step.outputs}
    for node in nodes_in_order([value]):
        if node.op == "load" and node.attr[0] in written and node.attr[1] != written[node.attr[0]][0]:
            return False
        if node.op == "scalar" and node.attr in written:
            return False

    def own(leaf):
        return written[leaf.attr[0]][1] if leaf.op == "load" and leaf.attr[0] in written else leaf

    substituted = map_leaves(value, own)
    if substituted.depth > MAX_FUSED_DEPTH:
        return False
    step.outputs.append((key, contiguous(shape), dtype, substituted))
    return True
