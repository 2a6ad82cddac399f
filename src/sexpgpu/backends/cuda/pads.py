"""Pads and concatenations: results made by copying their inputs into place (PyTorch's copies),
an input that lies at its place already left where it is (placement.py)."""

from __future__ import annotations

import numpy as np

from sexpgpu.backends.cuda.codegen.space import View, contiguous, contiguous_strides
from sexpgpu.backends.cuda.launches import TorchLaunch, reads_of, same_memory
from sexpgpu.graph.core.rules import RuleTable

PADS = RuleTable("cuda pads and concatenations", needs=lambda op: op.name in ("pad", "concat"))


@PADS.rule("pad")
def pad(lowerer, node) -> None:
    axis, before = node.attrs["axis"], node.attrs["before"]

    def write(out, x):
        out.zero_()
        out.narrow(axis, before, x.shape[axis]).copy_(x)

    lowerer.emit_torch(node, "pad", write)


@PADS.rule("concat")
def concat(lowerer, node) -> None:
    parts = lowerer.operands(node.inputs)
    key = lowerer.result_buffer(node)
    axis = node.attrs["axis"]
    starts = np.cumsum([0] + [source.shape[axis] for source in node.inputs]).tolist()
    run = _concatenation(parts, [tuple(source.shape) for source in node.inputs], key, axis, starts)
    aliases = tuple(_place_in(lowerer.buffers[source], key, node.shape, axis, start) for (source, view), start
                    in zip(parts, starts) if _placeable(lowerer.buffers[source], view, node.shape, axis))
    lowerer.buffers[key].live_from_start = bool(aliases)
    lowerer.emit_result(node, TorchLaunch(run, reads_of(parts), (key,), "concat", aliases=aliases))


def _placeable(buffer, view, shape, axis: int) -> bool:
    """Whether an input read whole, in its own order, can lie at its slice of the result:
    it can when the slices along `axis` are contiguous runs of the result."""
    whole = int(np.prod(view.dims)) == int(np.prod(buffer.shape)) and view == contiguous(view.dims)
    return buffer.kind == "input" and whole and int(np.prod(shape[:axis])) == 1


def _place_in(buffer, key: str, shape, axis: int, start: int):
    """(the input, the result, the input's place in the result, over the input's shape)."""
    return buffer.key, key, View(buffer.shape, contiguous_strides(buffer.shape), start * contiguous_strides(shape)[axis])


def _concatenation(parts, shapes, key: str, axis: int, starts: list):
    """The run of a concatenation: torch.cat, or, when some parts already lie at their
    place in the result (placement.py), a copy of the others alone. Each part is read in
    its node's shape: a part's view may keep its source's, as a 0-d value reshaped to (1,)."""
    import torch

    def run(env):
        out = env[key]
        sources = [part.strided(env).reshape(shape) for part, shape in zip(parts, shapes)]
        targets = [out.narrow(axis, start, piece.shape[axis]) for start, piece in zip(starts, sources)]
        moved = [(target, piece) for target, piece in zip(targets, sources) if not same_memory(target, piece)]
        if len(moved) == len(sources):
            torch.cat(sources, dim=axis, out=out)
        elif moved:
            torch._foreach_copy_([target for target, _ in moved], [piece for _, piece in moved])

    return run
