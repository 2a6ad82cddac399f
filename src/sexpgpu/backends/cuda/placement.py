"""Where a captured graph keeps its inputs and outputs: inside the arena, when that makes a
copy of the graph an identity.

A captured graph copies every input into a buffer of its own before the replay and every
output out of one after it. The optimizer's update concatenates hundreds of parameter
inputs into one flat vector, and its outputs are slices of flat results: copied in, then
concatenated; sliced, then copied out. A launch that is such a copy names, in `aliases`, the
arena place where an operand could live instead: a concatenation's input at its slice of
the flat vector, an output at the slice it is copied from. When the memory plan allows it
(nothing else uses that memory while it must hold the value), the runner puts the operand
there and the launch, finding its source and target to be the same memory, copies nothing.
The result is the same bits with a pass over the memory less on each side.

An update may also be made in place (`in_place`): the flat kernel that reads the flat
parameters (or moments) and writes their new values writes them over the old ones, element i
where element i was read, as any fused optimizer does. It applies only where the outputs placed
in the result are the inputs placed in the buffer it updates, of the same names at the same
places, so the outputs that come back as the next call's inputs already lie in their slots.
"""

from __future__ import annotations

from math import prod
from typing import NamedTuple

from sexpgpu.backends.cuda.codegen.expr import nodes_in_order
from sexpgpu.backends.cuda.codegen.space import contiguous
from sexpgpu.backends.cuda.launches import FlatLaunch


def placements(lowered) -> dict:
    """{buffer key: (arena key, view over the buffer's shape)} for the graph's inputs and
    outputs that may live in the arena."""
    first_write, last_read = _launch_ranges(lowered.launches)
    placed = {}
    for index, launch in enumerate(lowered.launches):
        for operand, target, view in getattr(launch, "aliases", ()):
            if lowered.buffers[operand].dtype != lowered.buffers[target].dtype:
                continue  # a copy that converts (a bf16 value read out as float32) must stay a copy
            kind = lowered.buffers[operand].kind
            if kind == "input" and _free_before(lowered, target, index, first_write) \
                    and last_read.get(operand, -1) <= last_read.get(target, -1):
                placed[operand] = (target, view)
            elif kind == "output" and _free_after(lowered, target, index, first_write):
                placed[operand] = (target, view)
    return placed


def _launch_ranges(launches) -> tuple[dict, dict]:
    first_write, last_read = {}, {}
    for index, launch in enumerate(launches):
        for key in launch.writes:
            first_write.setdefault(key, index)
        for key in launch.reads:
            last_read[key] = index
    return first_write, last_read


def _overlapping(lowered, key: str) -> list[str]:
    """The other arena buffers sharing any byte with `key`."""
    start = lowered.offsets[key]
    stop = start + lowered.buffers[key].nbytes
    return [other for other, offset in lowered.offsets.items()
            if other != key and offset < stop and start < offset + lowered.buffers[other].nbytes]


def _free_before(lowered, key: str, index: int, first_write: dict) -> bool:
    """Whether no launch before `index` writes memory of `key`: an input copied there before
    the replay survives until the launch that reads it."""
    if key not in lowered.offsets:
        return False
    return all(first_write.get(other, index) >= index for other in _overlapping(lowered, key))


def _free_after(lowered, key: str, index: int, first_write: dict) -> bool:
    """Whether no launch after `index` writes memory of `key`: the output read from there
    after the replay is still what the graph left."""
    if key not in lowered.offsets:
        return False
    return all(first_write.get(other, -1) <= index for other in _overlapping(lowered, key))


class _Uses(NamedTuple):
    """What the schedule does with each buffer, for telling whether a result may take one over."""

    last: dict  # key -> index of the last launch that reads or writes it
    writers: dict  # key -> how many launches write it
    inputs: dict  # arena key -> frozenset of (input name, view) placed in it
    outputs: dict  # arena key -> frozenset of (output name, view) placed in it


def in_place(schedule) -> dict:
    """{result key: arena key}: the flat kernels' results that take the memory of an arena
    buffer the same kernel reads last, each buffer in one pair: where the kernel reads each
    element where it writes it (`_updates_in_place`), and the outputs placed in the result are
    the inputs placed in the buffer, by the same names at the same places (so a result never
    takes the gradients' memory: m' reads both m and g, but is given back as m)."""
    uses = _Uses(_last_uses(schedule.launches), _writer_counts(schedule.launches),
                 _placed_names(schedule, "input"), _placed_names(schedule, "output"))
    pairs: dict = {}
    for index, launch in enumerate(schedule.launches):
        if not isinstance(launch, FlatLaunch):
            continue
        for result, view, _, value in launch.outputs:
            free = [key for key in _loaded_keys(value) if key not in pairs.values() and uses.last[key] == index]
            taken = [key for key in free if _same_names(uses, result, key)
                     and _updates_in_place(schedule, launch, result, view, key)]
            if taken and uses.writers[result] == 1:
                pairs[result] = taken[0]
    return pairs


def _same_names(uses: _Uses, result: str, source: str) -> bool:
    placed = uses.inputs.get(source)
    return bool(placed) and placed == uses.outputs.get(result)


def _updates_in_place(schedule, launch, result: str, view, source: str) -> bool:
    """Whether `launch` reads every element of `source` at the index where it writes that
    element of `result`, both arena buffers alike, and writes nothing into `source`: then each
    element's store, which depends on its load, follows it."""
    plain = contiguous(launch.shape)
    made, read = schedule.buffers[result], schedule.buffers[source]
    alike = made.kind == read.kind == "arena" and (made.dtype, made.shape) == (read.dtype, read.shape)
    loads = [node.attr[1] for node in nodes_in_order(launch.roots()) if node.op == "load" and node.attr[0] == source]
    return alike and view == plain and prod(launch.shape) == prod(made.shape) and source not in launch.writes \
        and all(load == plain for load in loads)


def _loaded_keys(value) -> list:
    """The buffers an expression loads, each once, in order."""
    return list(dict.fromkeys(node.attr[0] for node in nodes_in_order([value]) if node.op == "load"))


def _last_uses(launches) -> dict:
    last = {}
    for index, launch in enumerate(launches):
        for key in (*launch.reads, *launch.writes):
            last[key] = index
    return last


def _writer_counts(launches) -> dict:
    counts: dict = {}
    for launch in launches:
        for key in launch.writes:
            counts[key] = counts.get(key, 0) + 1
    return counts


def _placed_names(schedule, kind: str) -> dict:
    """{arena key: frozenset of (name, view)}: the graph's inputs (or outputs) whose copies a
    launch's `aliases` place in that arena buffer."""
    names = {key: name for name, key in getattr(schedule, kind + "s").items()}
    placed: dict = {}
    for launch in schedule.launches:
        for operand, target, view in getattr(launch, "aliases", ()):
            if schedule.buffers[operand].kind == kind and operand in names:
                placed.setdefault(target, set()).add((names[operand], view))
    return {key: frozenset(found) for key, found in placed.items()}
