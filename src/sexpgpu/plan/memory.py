"""The static memory plan of a graph: when each value lives, which buffer holds it, peak bytes.

Lifetimes follow the graph's node order (the order every backend executes):
- a graph input is held by the caller for the whole graph;
- a node's value is made at its own step and lives until the step of its last reader; an
  output lives to the end;
- during step i, the values read by node i and the value it makes are all live (no node
  writes over its own inputs).

Every value gets its own buffer (views such as reshape count as values too, so the plan is
an upper bound for a backend that aliases them). Buffers are reused greedily in node order:
before step i frees anything, node i takes the smallest free buffer that fits (the earliest
made among equals), growing nothing; with none free it gets a new buffer. After step i the
buffers of values whose last reader is node i return to the free list.

`peak_bytes` is the most bytes live at any step, inputs included: what a backend that
frees every value after its last reader needs at the least. `arena_bytes` is the sum of the
reused buffers: what this plan's allocation needs for values besides the inputs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryPlan:
    peak_bytes: int
    input_bytes: int
    arena_bytes: int
    buffers: tuple  # size in bytes of each buffer, in order of creation
    assignment: dict  # node position -> buffer index, for every value that is not an input
    live_bytes: tuple  # bytes live during each step (inputs included), one per node


def gib_text(count) -> str:
    """Bytes as messages say them: '2,608.0 GiB'."""
    return f"{(count or 0) / 2**30:,.1f} GiB"


def lifetimes(graph) -> list:
    """(born, dies) step positions of every node's value; inputs live from 0 to the end."""
    positions = graph.positions()
    end = len(graph.nodes) - 1
    spans = []
    for index, node in enumerate(graph.nodes):
        spans.append([0 if node.op == "input" else index, index])
    for index, node in enumerate(graph.nodes):
        for source in node.inputs:
            spans[positions[source]][1] = max(spans[positions[source]][1], index)
    for node in list(graph.outputs.values()) + list(graph.inputs.values()):
        spans[positions[node]][1] = end
    return [tuple(span) for span in spans]


def plan_memory(graph) -> MemoryPlan:
    spans = lifetimes(graph)
    sizes = [node.nbytes for node in graph.nodes]
    count = len(graph.nodes)
    live = [0] * (count + 1)
    for (born, dies), size in zip(spans, sizes):
        live[born] += size
        live[dies + 1] -= size
    running, live_bytes = 0, []
    for step in range(count):
        running += live[step]
        live_bytes.append(running)
    buffers, assignment = _assign_buffers(graph, spans, sizes)
    input_bytes = sum(node.nbytes for node in graph.inputs.values())
    return MemoryPlan(max(live_bytes, default=0), input_bytes, sum(buffers), tuple(buffers), assignment, tuple(live_bytes))


def _assign_buffers(graph, spans: list, sizes: list) -> tuple:
    buffers: list = []
    free: list = []  # (size, buffer index) of the free buffers, sorted: the best fit is a bisection away
    dying: dict = {}
    assignment = {}
    for index, node in enumerate(graph.nodes):
        if node.op == "input":
            continue
        at = bisect.bisect_left(free, (sizes[index], -1))
        if at == len(free):
            buffers.append(sizes[index])
            chosen = len(buffers) - 1
        else:
            chosen = free.pop(at)[1]
        assignment[index] = chosen
        dying.setdefault(spans[index][1], []).append(chosen)
        for released in dying.pop(index, []):
            bisect.insort(free, (buffers[released], released))
    return buffers, assignment
