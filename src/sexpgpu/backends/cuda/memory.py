"""The static memory plan of a lowered graph: one arena, every intermediate buffer at a fixed
offset in it.

A buffer lives from the step that writes it to the last step that reads it, both included,
so a step never writes over memory that it or a step before it still reads. Steps are taken
in order; at each step the buffers it makes take the best-fitting free block (the smallest
that fits, the lowest offset among equals), then the buffers it read for the last time give
their blocks back, merged with free neighbours. The plan is fixed by the graph and the
shapes, so every run of the graph uses the same addresses, which is also what lets a step be
captured as a CUDA graph. Graph inputs belong to the caller and outputs are allocated apart,
since they outlive the call.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGNMENT = 256


@dataclass(frozen=True)
class Lifetime:
    key: str
    nbytes: int
    born: int
    dies: int


@dataclass(frozen=True)
class ArenaPlan:
    offsets: dict  # key -> byte offset in the arena
    arena_bytes: int


def _aligned(size: int) -> int:
    return max(ALIGNMENT, -(-size // ALIGNMENT) * ALIGNMENT)


def plan_arena(lifetimes: list[Lifetime]) -> ArenaPlan:
    free: list[list[int]] = []  # [offset, size], sorted by offset
    top = 0
    offsets: dict = {}
    births: dict = {}
    deaths: dict = {}
    for life in lifetimes:
        births.setdefault(life.born, []).append(life)
        deaths.setdefault(life.dies, []).append(life)
    for step in sorted(set(births) | set(deaths)):
        for life in births.get(step, []):
            size = _aligned(life.nbytes)
            offset = _take(free, size)
            if offset is None:
                offset, top = top, top + size
            offsets[life.key] = offset
        for life in deaths.get(step, []):
            _give_back(free, offsets[life.key], _aligned(life.nbytes))
    return ArenaPlan(offsets, top)


def _take(free: list, size: int) -> int | None:
    fitting = [block for block in free if block[1] >= size]
    if not fitting:
        return None
    block = min(fitting, key=lambda item: (item[1], item[0]))
    offset = block[0]
    if block[1] == size:
        free.remove(block)
    else:
        block[0] += size
        block[1] -= size
    return offset


def _give_back(free: list, offset: int, size: int) -> None:
    free.append([offset, size])
    free.sort()
    merged: list = []
    for block in free:
        if merged and merged[-1][0] + merged[-1][1] == block[0]:
            merged[-1][1] += block[1]
        else:
            merged.append(block)
    free[:] = merged
