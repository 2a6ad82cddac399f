"""Fused elementwise kernels: any number of outputs over one iteration space, each an
expression of the inputs read through their views. Nothing is summed, so the only order
that matters is each expression's own, which the renderer keeps."""

from __future__ import annotations

from dataclasses import dataclass

from sexpgpu.backends.cuda.codegen.compile import GeneratedKernel, module_source, signature
from sexpgpu.backends.cuda.codegen.expr import Expr, operand_views
from sexpgpu.backends.cuda.codegen.render import Renderer
from sexpgpu.backends.cuda.codegen.space import STORAGE_TYPES, View, needs_wide_index, numel, view_offset

BLOCK = 1024
NUM_WARPS = 4


@dataclass(frozen=True)
class FlatSpec:
    """Operands are the inputs then the outputs, in this order, in the kernel signature.
    `inputs` holds each input's storage dtype; an output is (view over `shape`, storage
    dtype, value)."""

    shape: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[tuple[View, str, Expr], ...]


def load_source(pointer: str, dtype: str, offset: str, mask: str | None) -> str:
    """A load; bf16 storage is widened to float32 through the bits (see bits.py)."""
    masked = f", mask={mask}, other=0" if mask else ""
    text = f"tl.load({pointer} + {offset}{masked})"
    return f"load_bf16({text})" if dtype == "bf16" else text


def store_source(pointer: str, dtype: str, offset: str, value: str, mask: str | None) -> str:
    """A store converting to the storage dtype; into bf16 it rounds to nearest even."""
    masked = f", mask={mask}" if mask else ""
    converted = f"store_bf16({value})" if dtype == "bf16" else f"{value}.to({STORAGE_TYPES[dtype]})"
    return f"tl.store({pointer} + {offset}, {converted}{masked})"


def lane_offset(lanes: str, offset: str, varies: bool) -> str:
    """A masked store's offset as a block over `lanes`. An offset that does not vary along
    them (the stored value is one element: an axis of size 1, a 0-d value) is broadcast over
    the lanes, since Triton stores a block only through a block of pointers; the mask keeps
    the one lane that writes it."""
    return offset if varies else f"{lanes} * 0 + {offset}"


def indexed_load(pointer: str, dtype: str, offset: str, mask: str) -> str:
    """A masked load at `offset`; an offset that is one constant (every position reads the
    same element) is read once, unmasked, as a scalar."""
    return load_source(pointer, dtype, offset, None if offset.isdigit() else mask)


def iota_source(offset: str) -> str:
    return f"tl.full([], {offset}, tl.int32)" if offset.isdigit() else f"({offset}).to(tl.int32)"


def flat_source(spec: FlatSpec) -> str:
    pointers = [f"p{index}" for index in range(len(spec.inputs) + len(spec.outputs))]
    values = [value for _, _, value in spec.outputs]
    wide = needs_wide_index(spec.shape, operand_views(values) + [view for view, _, _ in spec.outputs])

    def leaf(node: Expr, args):
        if node.op == "load":
            operand, view = node.attr
            return indexed_load(pointers[operand], spec.inputs[operand], view_offset("i", view), "mask")
        if node.op == "scalar":
            return load_source(pointers[node.attr], spec.inputs[node.attr], "0", None)
        if node.op == "iota":
            return iota_source(view_offset("i", node.attr))
        raise ValueError(f"a flat kernel cannot read {node.op}")

    renderer = Renderer(leaf)
    first = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    lines = [
        "@triton.jit",
        "",  # the signature, once the body says whether it reads the numerics table
        f"    i = {first} * {BLOCK} + tl.arange(0, {BLOCK})",
        f"    mask = i < {numel(spec.shape)}",
    ]
    stores = []
    for number, (view, dtype, value) in enumerate(spec.outputs):
        name = renderer.value(value)
        pointer = pointers[len(spec.inputs) + number]
        offset = view_offset("i", view)
        offset = lane_offset("i", offset, not offset.isdigit())
        stores.append("    " + store_source(pointer, dtype, offset, name, "mask"))
    lines[1] = signature(pointers, renderer.uses_table)
    return module_source(renderer.imports, lines + renderer.lines + stores)


def flat_kernel(spec: FlatSpec) -> GeneratedKernel:
    grid = (max(1, -(-numel(spec.shape) // BLOCK)),)
    return GeneratedKernel(flat_source(spec), grid, NUM_WARPS, "flat")
