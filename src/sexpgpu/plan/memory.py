"""The static memory plan: when each value lives (`liveness`), where it lies (`plan_arena`),
peak bytes. One analysis for every backend: the interpreter's graph, whose steps are its
nodes (`plan_memory`), and the CUDA backend's kernel steps, whose arena is this plan with
its 256-byte alignment (backends/cuda/lowering.py).

Liveness, over a sequence of steps that each read and write values:
- a value is made at the first step that writes it and lives to the last step that reads or
  writes it, both included, so a step never writes over memory that it or a step before it
  still reads (no node writes over its own inputs);
- a value held for the whole sequence (a graph input, which the caller holds; a CUDA buffer
  that inputs may be placed in) lives from the first step to the last, and an output from
  the step that makes it to the last; a value held from the start only (a CUDA buffer of
  placed inputs that a kernel updates in place) lives from the first step to its last use.

The arena: steps are taken in order; at each step the values it makes take the best-fitting
free block (the smallest that fits, the lowest offset among equals), then the values it read
for the last time give their blocks back, merged with free neighbours. A value may instead
take over the block of one that dies at the very step it is born (`takes`: an update made in
place, each element written where it was read); that block then passes to the new value
instead of going back. The plan is fixed by the graph and the shapes, so every run of the
graph uses the same addresses, which is also what lets a CUDA step be captured as a CUDA graph.

`peak_bytes` is the most bytes live at any step, inputs included: what a backend that
frees every value after its last reader needs at the least. `arena_bytes` is the arena's
size: what this plan's allocation needs for values besides the inputs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Lifetime:
    key: object
    nbytes: int
    born: int
    dies: int


@dataclass(frozen=True)
class ArenaPlan:
    offsets: dict  # key -> byte offset in the arena
    arena_bytes: int
    takes: dict = field(default_factory=dict)  # key -> the key whose block it took over

    def dump(self) -> str:
        return "\n".join([f"arena {self.arena_bytes} bytes"] + [f"{key} at {at}" for key, at in self.offsets.items()]
                         + [f"{key} takes {old}" for key, old in self.takes.items()])


@dataclass(frozen=True)
class MemoryPlan:
    peak_bytes: int
    input_bytes: int
    arena_bytes: int
    offsets: dict  # node position -> byte offset in the arena, for every value that is not an input
    live_bytes: tuple  # bytes live during each step (inputs included), one per node


def gib_text(count) -> str:
    """Bytes as messages say them: '2,608.0 GiB'."""
    return f"{(count or 0) / 2**30:,.1f} GiB"


def liveness(steps, nbytes, whole=frozenset(), to_end=frozenset(), from_start=frozenset()) -> list[Lifetime]:
    """The lifetime of every value a step writes, in the order they are first written.
    `steps`: (reads, writes) of each step, in order; `nbytes(key)`: a value's size; `whole`:
    values held from the first step to the last; `to_end`: values held to the last step;
    `from_start`: values held from the first step."""
    born: dict = {}
    dies: dict = {}
    last = -1
    for last, (reads, writes) in enumerate(steps):
        for key in writes:
            born.setdefault(key, 0 if key in whole or key in from_start else last)
            dies[key] = last
        for key in reads:
            dies[key] = last
    return [Lifetime(key, nbytes(key), born[key], last if key in whole or key in to_end else dies[key]) for key in born]


def lifetimes(graph) -> list:
    """(born, dies) step positions of every node's value; inputs live from 0 to the end."""
    positions = graph.positions()
    steps = [([positions[source] for source in node.inputs], (index,)) for index, node in enumerate(graph.nodes)]
    held = {index for index, node in enumerate(graph.nodes) if node.op == "input"}
    to_end = {positions[node] for node in list(graph.outputs.values()) + list(graph.inputs.values())}
    return [(life.born, life.dies) for life in liveness(steps, lambda key: 0, held, to_end)]


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
    made = [Lifetime(index, sizes[index], born, dies) for index, (born, dies) in enumerate(spans)
            if graph.nodes[index].op != "input"]
    arena = plan_arena(made, alignment=1)
    input_bytes = sum(node.nbytes for node in graph.inputs.values())
    return MemoryPlan(max(live_bytes, default=0), input_bytes, arena.arena_bytes, arena.offsets, tuple(live_bytes))


def plan_arena(lives: list[Lifetime], alignment: int, takes=None) -> ArenaPlan:
    """Offsets in one arena for values whose lifetimes are `lives`, each block a multiple of
    `alignment` bytes (at least one). `takes`: {key: old key} for a value that takes over the
    block of one dying at the step it is born, of the same aligned size."""
    takes = dict(takes or {})
    sizes = {life.key: _aligned(life.nbytes, alignment) for life in lives}
    _check_takeovers(lives, sizes, takes)
    given_over = set(takes.values())
    free = _FreeBlocks()
    top = 0
    offsets: dict = {}
    births: dict = {}
    deaths: dict = {}
    for life in lives:
        births.setdefault(life.born, []).append(life)
        deaths.setdefault(life.dies, []).append(life)
    for step in sorted(set(births) | set(deaths)):
        for life in births.get(step, []):
            offset = offsets[takes[life.key]] if life.key in takes else free.take(sizes[life.key])
            if offset is None:
                offset, top = top, top + sizes[life.key]
            offsets[life.key] = offset
        for life in deaths.get(step, []):
            if life.key not in given_over:  # its block now holds the value that took it over
                free.give_back(offsets[life.key], sizes[life.key])
    return ArenaPlan(offsets, top, takes)


def _check_takeovers(lives: list[Lifetime], sizes: dict, takes: dict) -> None:
    """A takeover hands a block from a value to one born at the step the old one dies, of its size."""
    by_key = {life.key: life for life in lives}
    if len(set(takes.values())) != len(takes):
        raise ValueError(f"a block taken over twice: {takes}")
    for key, old in takes.items():
        new, held = by_key.get(key), by_key.get(old)
        if new is None or held is None or held.dies != new.born or held.born >= new.born \
                or sizes[key] != sizes[old]:
            raise ValueError(f"{key} cannot take over the block of {old}: {new} and {held} do not meet")


def _aligned(size: int, alignment: int) -> int:
    return max(alignment, -(-size // alignment) * alignment)


class _FreeBlocks:
    """The arena's free blocks, never two adjacent: the best fit is a bisection away."""

    def __init__(self):
        self.by_size: list = []  # (size, offset), sorted
        self.starts: dict = {}  # offset -> size
        self.ends: dict = {}  # offset + size -> offset

    def take(self, size: int) -> int | None:
        at = bisect.bisect_left(self.by_size, (size, -1))
        if at == len(self.by_size):
            return None
        block, offset = self.by_size[at]
        self._remove(offset, block)
        if block > size:
            self._add(offset + size, block - size)
        return offset

    def give_back(self, offset: int, size: int) -> None:
        if offset in self.ends:  # a free block ends where this one starts
            before = self.ends[offset]
            size += self.starts[before]
            self._remove(before, self.starts[before])
            offset = before
        if offset + size in self.starts:
            after = offset + size
            size += self.starts[after]
            self._remove(after, self.starts[after])
        self._add(offset, size)

    def _add(self, offset: int, size: int) -> None:
        bisect.insort(self.by_size, (size, offset))
        self.starts[offset] = size
        self.ends[offset + size] = offset

    def _remove(self, offset: int, size: int) -> None:
        self.by_size.pop(bisect.bisect_left(self.by_size, (size, offset)))
        del self.starts[offset]
        del self.ends[offset + size]
