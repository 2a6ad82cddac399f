"""Fused elementwise kernels: any number of outputs over one iteration space, each an
expression of the inputs read through their views. Nothing is summed, so the only order
that matters is each expression's own, which the renderer keeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sexpgpu.backends.cuda.codegen.compile import GeneratedKernel, module_source, signature
from sexpgpu.backends.cuda.codegen.expr import Expr, nodes_in_order, operand_views
from sexpgpu.backends.cuda.codegen.render import Renderer
from sexpgpu.backends.cuda.codegen.space import STORAGE_TYPES, View, needs_wide_index, numel, view_offset

BLOCK = 1024
NUM_WARPS = 4
# A matrix read across its rows (a weight cast to bf16 into its transpose) runs as tiles of
# TILE_ROWS x TILE_COLUMNS: each load and each store then walks memory along its own
# contiguous axis (32 float32 or 64 bf16 are 128 bytes), and Triton moves the tile between the
# two orders through shared memory. Walked flat, every lane of the transposed load read its own
# 128-byte line. Each element is computed alone either way, so the bits are the same.
TILE_ROWS, TILE_COLUMNS = 32, 64
MAX_GRID_Y = 65535  # CUDA's bound on a grid's second dimension


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


@dataclass(frozen=True)
class FlatIndex:
    """How a flat kernel's programs walk its space, and each view's offsets under that walk."""

    header: tuple[str, ...]  # the lines that make the positions and `mask`
    grid: tuple[int, ...]
    offset: Callable[[View], str]  # a view's element offsets, as Triton source
    store_offset: Callable[[View], str]  # the same, broadcast to the whole block


def flat_walk(shape, wide: bool) -> FlatIndex:
    """BLOCK positions a program, in row-major order."""
    first = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    header = (f"    i = {first} * {BLOCK} + tl.arange(0, {BLOCK})", f"    mask = i < {numel(shape)}")

    def store_offset(view: View) -> str:
        offset = view_offset("i", view)
        return lane_offset("i", offset, not offset.isdigit())

    return FlatIndex(header, (max(1, -(-numel(shape) // BLOCK)),), lambda view: view_offset("i", view), store_offset)


def tile_walk(shape) -> FlatIndex:
    """TILE_ROWS x TILE_COLUMNS positions of a matrix a program, each view's offset the sum of
    its two axes' terms."""
    rows, columns = shape
    header = (f"    rr = (tl.program_id(0) * {TILE_ROWS} + tl.arange(0, {TILE_ROWS}))[:, None]",
              f"    cc = (tl.program_id(1) * {TILE_COLUMNS} + tl.arange(0, {TILE_COLUMNS}))[None, :]",
              f"    mask = (rr < {rows}) & (cc < {columns})")

    def offset(view: View) -> str:
        terms = [term if stride == 1 else f"{term} * {stride}" for term, stride in zip(("rr", "cc"), view.strides) if stride]
        return " + ".join(terms + [str(view.offset)] if view.offset or not terms else terms)

    def store_offset(view: View) -> str:
        return f"rr * {view.strides[0]} + cc * {view.strides[1]} + {view.offset}"

    return FlatIndex(header, (-(-rows // TILE_ROWS), -(-columns // TILE_COLUMNS)), offset, store_offset)


def reads_across_rows(shape, views) -> bool:
    """Whether a matrix kernel reads an operand along its first axis (stride 1 there, not
    along the second, which a broadcast's stride 0 is not): the loads a flat walk cannot coalesce."""
    return len(shape) == 2 and min(shape) > 1 and any(view.strides[0] == 1 and view.strides[1] not in (0, 1) for view in views)


def walk_for(spec: FlatSpec, loads: list, stores: list) -> FlatIndex:
    wide = needs_wide_index(spec.shape, loads + stores)
    over = all(view.over(spec.shape) for view in loads + stores)
    if not wide and over and reads_across_rows(spec.shape, loads) and spec.shape[1] <= TILE_COLUMNS * MAX_GRID_Y:
        return tile_walk(spec.shape)
    return flat_walk(spec.shape, wide)


def flat_kernel(spec: FlatSpec) -> GeneratedKernel:
    pointers = [f"p{index}" for index in range(len(spec.inputs) + len(spec.outputs))]
    values = [value for _, _, value in spec.outputs]
    iotas = [node.attr for node in nodes_in_order(values) if node.op == "iota"]
    walk = walk_for(spec, operand_views(values) + iotas, [view for view, _, _ in spec.outputs])

    def leaf(node: Expr, args):
        if node.op == "load":
            operand, view = node.attr
            return indexed_load(pointers[operand], spec.inputs[operand], walk.offset(view), "mask")
        if node.op == "scalar":
            return load_source(pointers[node.attr], spec.inputs[node.attr], "0", None)
        if node.op == "iota":
            return iota_source(walk.offset(node.attr))
        raise ValueError(f"a flat kernel cannot read {node.op}")

    renderer = Renderer(leaf)
    lines = ["@triton.jit", ""] + list(walk.header)  # the signature, once the body says whether it reads the table
    stores = []
    for number, (view, dtype, value) in enumerate(spec.outputs):
        name = renderer.value(value)
        pointer = pointers[len(spec.inputs) + number]
        stores.append("    " + store_source(pointer, dtype, walk.store_offset(view), name, "mask"))
    lines[1] = signature(pointers, renderer.uses_table)
    return GeneratedKernel(module_source(renderer.imports, lines + renderer.lines + stores), walk.grid, NUM_WARPS, "flat")
