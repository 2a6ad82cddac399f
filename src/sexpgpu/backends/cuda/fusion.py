"""The fusion planner: which values a fused kernel recomputes instead of reading.

An elementwise node is not computed by a kernel of its own: its expression is inlined into
each kernel that reads it (a later elementwise kernel, a row or column reduction, a
normalisation). A node read by one kernel is therefore computed once, where it is read. A
node read by several kernels is recomputed by each of them when that is cheaper than
writing it once and reading it back: when its expression costs at most BUDGET flops per
byte of the value (9 flops a byte, the spec's figure for an A100, as used under
--deterministic; the later choices issue measures it per device and records it), and it has
at most four readers (each recomputing reader is one more kernel to compile). A value a
reader sees broadcast to a larger shape (a per-row statistic, a scalar) is inlined only when
it costs at most 2 flops, since the broadcast would repeat its arithmetic for every copy.
Otherwise,
or when a reader needs memory (a product, a gather, a copy, an output of the graph), the
node is written out by a fused elementwise kernel, which also takes the other values of the
same shape written out just before it.

Recomputing keeps every node's rounding: the inlined expression is the node's own, in
float32 with the node's bf16 rounding, and no multiply-add is contracted (enable_fp_fusion
is off), so fusion decides where a value is computed, never what it is.

SEXPGPU_OPTIMIZE sets how much is fused:
  on  (default) inline as above, merge neighbouring elementwise kernels, capture CUDA graphs;
  off           every node is its own kernel and nothing is captured: the unfused lowering.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sexpgpu.backends.cuda.kernels.expr import flops, nodes_in_order
from sexpgpu.errors import SexpgpuError

BUDGET_FLOPS_PER_BYTE = 9.0
MAX_INLINE_NODES = 160  # a longer expression is written out, to bound compile time
MAX_RECOMPUTING_READERS = 4  # more readers than this read the value back: each is a kernel to compile
BROADCAST_FLOPS = 2  # a value read broadcast to a larger shape is inlined only below this
VIEW_OPS = ("reshape", "transpose", "slice", "broadcast")
LEVELS = ("on", "off")


@dataclass(frozen=True)
class FusionPolicy:
    level: str = "on"
    budget: float = BUDGET_FLOPS_PER_BYTE  # the seam for the measured recompute budget

    @property
    def fuses(self) -> bool:
        return self.level == "on"


def policy_from_environment() -> FusionPolicy:
    level = os.environ.get("SEXPGPU_OPTIMIZE", "on").strip().lower() or "on"
    if level not in LEVELS:
        raise SexpgpuError("E-CONFIG-001", f"SEXPGPU_OPTIMIZE is '{level}': expected one of {', '.join(LEVELS)}.")
    return FusionPolicy(level)


def reader_counts(graph) -> dict:
    """node -> how many kernels read it: readers through movement ops count as the
    movement's own readers; an output of the graph counts as a reader."""
    consumers = graph.consumers()
    outputs = {}
    for node in graph.outputs.values():
        outputs[node] = outputs.get(node, 0) + 1
    counts: dict = {}
    for node in reversed(graph.nodes):
        total = outputs.get(node, 0)
        for reader in consumers[node]:
            total += counts[reader] if reader.op in VIEW_OPS else 1
        counts[node] = total
    return counts


def broadcastable(policy: FusionPolicy, value, source_size: int, target_size: int) -> bool:
    """Whether a reader that sees the value broadcast to more elements may inline it: a
    broadcast repeats the value's arithmetic for every copy, so only a value that costs
    (almost) nothing is inlined so; any other is written out at its own size first."""
    return target_size <= source_size or flops([value]) <= BROADCAST_FLOPS


def recompute(policy: FusionPolicy, value, readers: int, itemsize: int) -> bool:
    """Whether each reader recomputes this value's expression rather than read it back."""
    if not policy.fuses:
        return False
    if len(nodes_in_order([value])) > MAX_INLINE_NODES:
        return False
    cost = flops([value])
    if cost == 0:  # a constant or a view: nothing to recompute
        return True
    if readers > MAX_RECOMPUTING_READERS:
        return False
    return readers <= 1 or cost <= policy.budget * itemsize
