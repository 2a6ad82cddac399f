"""Column kernels: reductions over leading axes (a bias gradient, a sum over the batch).

The space is the reduced axes followed by the kept axes. A program owns BLOCK_K kept
positions and a fixed CHUNK of reduced positions, walked as tiles of BLOCK_R x BLOCK_K:
tile lane (i, j) folds reduced positions i, i + BLOCK_R, ... of its chunk in increasing
order, then the pairwise tree of rows.combine_lanes combines the BLOCK_R lanes of each
column. When the reduced extent is longer than one CHUNK, each chunk
writes a partial result and a second column kernel reduces the partials the same way. Every
size here is a function of the shapes alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from sexpgpu.backends.cuda.codegen.compile import GeneratedKernel, module_source, signature
from sexpgpu.backends.cuda.codegen.expr import Expr, load, operand_views, shift_operands
from sexpgpu.backends.cuda.codegen.flat import indexed_load, iota_source, lane_offset, load_source, store_source
from sexpgpu.backends.cuda.codegen.render import Renderer
from sexpgpu.backends.cuda.codegen.rows import COMBINE, INITIAL, Reduction, combine_lanes
from sexpgpu.backends.cuda.codegen.space import (View, contiguous, needs_wide_index, numel, offset_expression,
                                                 power_of_two_block)

NUM_WARPS = 8


@dataclass(frozen=True)
class ColumnTile:
    """Elements in a tile, the widest run of kept columns a tile takes, and tiles of rows in
    a chunk, for kept extents up to `widest`."""

    widest: int | None  # None: any
    elements: int
    chunk_tiles: int
    block_k: int


# Sums up to 4096 wide: the fastest of 9 tilings timed on an H200 as replays of the column
# kernel alone over 8192 rows of 768 and 3072 columns and 16384 rows of 512 and 2048
# (20 to 36% faster than the tiles before at 512 and 768 wide, 15 to 17% at 2048 and 3072).
# Its chunks of 128 rows make a grid of thousands of programs at 8192 rows, where chunks of
# 1024 made 192 at 3072 wide for 132 multiprocessors, also for a kernel that computes much per
# element (gelu's gradient). Wider sums: the fastest of 24 tilings timed over 16384 rows of
# 24576 columns.
COLUMN_TILES = (ColumnTile(4096, 2048, 4, 64), ColumnTile(None, 8192, 16, 128))


def column_tile(kept_count: int) -> ColumnTile:
    return next(tile for tile in COLUMN_TILES if tile.widest is None or kept_count <= tile.widest)


@dataclass(frozen=True)
class ColumnSpec:
    """Loads read views over `reduced + kept`; `inputs` holds the operands' storage dtypes;
    outputs are (view over `kept`, storage dtype); each store is an expression of the
    reductions' results `row(k)` (and of scalars)."""

    reduced: tuple[int, ...]
    kept: tuple[int, ...]
    inputs: tuple[str, ...]
    reductions: tuple[Reduction, ...]
    outputs: tuple[tuple[View, str], ...]
    stores: tuple[tuple[int, Expr], ...]
    # elementwise values over `space` (views over it, storage dtypes), each stored by the tile
    # that reads its operands for the reductions: an elementwise kernel joined, that no longer
    # reads them again (fusion.JOINS)
    tile_outputs: tuple[tuple[View, str], ...] = ()
    tile_stores: tuple[tuple[int, Expr], ...] = ()

    @property
    def space(self) -> tuple[int, ...]:
        return tuple(self.reduced) + tuple(self.kept)


def with_roots(spec: ColumnSpec, roots, inputs) -> ColumnSpec:
    """The spec with its expressions (reductions, then stores) replaced, and the operands'
    storage dtypes `inputs`."""
    values = list(roots)
    count, stored = len(spec.reductions), len(spec.reductions) + len(spec.stores)
    reductions = tuple(Reduction(reduction.kind, value) for reduction, value in zip(spec.reductions, values[:count]))
    stores = tuple((output, value) for (output, _), value in zip(spec.stores, values[count:stored]))
    tile_stores = tuple((output, value) for (output, _), value in zip(spec.tile_stores, values[stored:]))
    return ColumnSpec(spec.reduced, spec.kept, tuple(inputs), reductions, spec.outputs, stores, spec.tile_outputs,
                      tile_stores)


def roots_of(spec: ColumnSpec) -> list:
    return ([reduction.value for reduction in spec.reductions] + [value for _, value in spec.stores]
            + [value for _, value in spec.tile_stores])


def tile_for(kept_count: int, reduced_count: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_K). Fewer reduced positions than a tile's rows (a sum over a batch of
    8) take only the lanes they fill, rounded up to a power of two, so that the pairwise tree
    does not combine empty lanes. The bits are the same: every lane's sum starts at +0, so
    an empty lane holds +0 and a full one is never -0 (rounding to nearest gives -0 only for
    -0 + -0), and adding +0 to any other value returns it."""
    tile = column_tile(kept_count)
    block_k = power_of_two_block(kept_count, 1, tile.block_k)
    block_r = min(tile.elements // block_k, 128)
    return power_of_two_block(reduced_count, 2, block_r), block_k


class _ColumnSource:
    def __init__(self, spec: ColumnSpec, parts: int):
        self.spec = spec
        self.parts = parts
        self.block_r, self.block_k = tile_for(numel(spec.kept), numel(spec.reduced))
        self.chunk = self.block_r * column_tile(numel(spec.kept)).chunk_tiles if parts > 1 else numel(spec.reduced)
        self.rank = len(spec.reduced)
        output_count = len(spec.reductions) if parts > 1 else len(spec.outputs)
        self.tiles_base = len(spec.inputs) + output_count
        self.pointers = [f"p{index}" for index in range(self.tiles_base + len(spec.tile_outputs))]
        self.renderer = Renderer(self._leaf, "        ")

    def _tile_offset(self, view: View) -> tuple[str, str]:
        """The offset of each tile lane's element, and the mask its load takes: an operand
        that varies along one side of the tile only (a per-row statistic, a per-column
        bias) is loaded as a column or a row of the tile, once, not once per lane."""
        if not view.over(self.spec.space):
            flat = f"(rr * {numel(self.spec.kept)} + kk)"
            return offset_expression(flat, view.dims, view.strides, view.offset), "mask"
        reduced = offset_expression("rr", self.spec.reduced, view.strides[:self.rank], view.offset)
        kept = offset_expression("kk", self.spec.kept, view.strides[self.rank:])
        if kept == "0":
            return reduced, "rmask"
        return (kept, "kmask[None, :]") if reduced == "0" else (f"({reduced}) + ({kept})", "mask")

    def _leaf(self, node: Expr, args) -> str:
        if node.op == "load":
            operand, view = node.attr
            offset, mask = self._tile_offset(view)
            return indexed_load(self.pointers[operand], self.spec.inputs[operand], offset, mask)
        if node.op == "iota":
            return iota_source(self._tile_offset(node.attr)[0])
        if node.op == "scalar":
            return load_source(self.pointers[node.attr], self.spec.inputs[node.attr], "0", None)
        if node.op == "row":
            return f"s{node.attr}"
        raise ValueError(f"a column kernel cannot read {node.op}")

    def source(self) -> str:
        spec = self.spec
        kept_count, reduced_count = numel(spec.kept), numel(spec.reduced)
        roots = [reduction.value for reduction in spec.reductions] + [value for _, value in spec.tile_stores]
        wide = needs_wide_index(spec.space, operand_views(roots) + [view for view, _ in spec.tile_outputs])
        lines = [
            "@triton.jit",
            "",  # the signature, once the body says whether it reads the numerics table
            f"    k = tl.program_id(0) * {self.block_k} + tl.arange(0, {self.block_k})",
            f"    kmask = k < {kept_count}",
            "    kk = k[None, :]",
            "    part = tl.program_id(1)" + (".to(tl.int64)" if wide else ""),
            f"    lanes = tl.arange(0, {self.block_r})",
        ]
        for number, reduction in enumerate(spec.reductions):
            lines.append(f"    a{number} = tl.full([{self.block_r}, {self.block_k}], {INITIAL[reduction.kind]}, tl.float32)")
        lines += [
            f"    for r0 in range(0, {self.chunk}, {self.block_r}):",
            f"        rows = part * {self.chunk} + r0 + lanes",
            "        rr = rows[:, None]",
            f"        rmask = rr < {reduced_count}",
            "        mask = rmask & kmask[None, :]",
        ]
        updates = []
        for number, reduction in enumerate(spec.reductions):
            value = self.renderer.value(reduction.value)
            masked = f"tl.where(mask, {value}, {INITIAL[reduction.kind]})"
            updates.append(f"        a{number} = {COMBINE[reduction.kind]}(a{number}, {masked})")
        tile_stores = [self._tile_store(output, value) for output, value in spec.tile_stores]
        lines += self.renderer.lines + updates + tile_stores
        for number, reduction in enumerate(spec.reductions):
            lines += combine_lanes(f"a{number}", f"s{number}", reduction.kind, [self.block_r, self.block_k])
        lines += self._stores(kept_count)
        lines[1] = signature(self.pointers, self.renderer.uses_table or self._epilogue_table)
        return module_source(self.renderer.imports, lines)

    def _tile_store(self, output: int, value: Expr) -> str:
        view, dtype = self.spec.tile_outputs[output]
        offset, mask = self._tile_offset(view)
        return "        " + store_source(self.pointers[self.tiles_base + output], dtype, offset,
                                         self.renderer.value(value), mask)

    def _stores(self, kept_count: int) -> list[str]:
        base = len(self.spec.inputs)
        self._epilogue_table = False
        if self.parts > 1:
            return [f"    tl.store({self.pointers[base + number]} + part * {kept_count} + k, s{number}, mask=kmask)"
                    for number in range(len(self.spec.reductions))]
        epilogue = Renderer(self._leaf)
        epilogue.imports = self.renderer.imports
        lines = []
        self._epilogue_table = False
        for output, value in self.spec.stores:
            name = epilogue.value(value)
            self._epilogue_table = self._epilogue_table or epilogue.uses_table
            view, dtype = self.spec.outputs[output]
            offset = offset_expression("k", view.dims, view.strides, view.offset)
            offset = lane_offset("k", offset, not offset.isdigit())
            lines.append("    " + store_source(self.pointers[base + output], dtype, offset, name, "kmask"))
        return epilogue.lines + lines


def parts_for(spec: ColumnSpec) -> int:
    block_r, _ = tile_for(numel(spec.kept), numel(spec.reduced))
    chunk = block_r * column_tile(numel(spec.kept)).chunk_tiles
    return max(1, -(-numel(spec.reduced) // chunk))


class ColumnKernel:
    """A column spec ready to launch: `kernel(*inputs, *outputs)`."""

    def __init__(self, spec: ColumnSpec):
        self.spec = spec
        self.parts = parts_for(spec)
        block_k = tile_for(numel(spec.kept), numel(spec.reduced))[1]
        grid = (-(-numel(spec.kept) // block_k), self.parts)
        source = _ColumnSource(spec, self.parts)
        self.first = GeneratedKernel(source.source(), grid, NUM_WARPS, "columns")
        self.rest = None
        if self.parts > 1:
            partial = contiguous((self.parts,) + tuple(spec.kept))
            combine = tuple(Reduction(reduction.kind, load(number, partial)) for number, reduction in enumerate(spec.reductions))
            stores = tuple((output, shift_operands(value, len(combine))) for output, value in spec.stores)
            self.rest = ColumnKernel(ColumnSpec((self.parts,), tuple(spec.kept), ("f32",) * len(combine) + spec.inputs,
                                                combine, spec.outputs, stores))

    def __call__(self, *operands) -> None:
        """operands: the inputs, the outputs, then the tile outputs."""
        if self.rest is None:
            self.first(*operands)
            return
        import torch

        inputs, ends = operands[:len(self.spec.inputs)], len(self.spec.inputs) + len(self.spec.outputs)
        outputs, tiles = operands[len(self.spec.inputs):ends], operands[ends:]
        partials = [torch.empty((self.parts, numel(self.spec.kept)), dtype=torch.float32, device=outputs[0].device)
                    for _ in self.spec.reductions]
        self.first(*inputs, *partials, *tiles)
        self.rest(*partials, *inputs, *outputs)

