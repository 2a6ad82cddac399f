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
"""

from __future__ import annotations


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
