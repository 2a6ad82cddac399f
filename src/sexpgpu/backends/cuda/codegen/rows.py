"""Row kernels: one program per row, running phases in order.

The space is `lead + reduced`: a row is one position of the lead axes and its LENGTH
elements are the reduced axes in C order. A phase walks its row in chunks of BLOCK. Each of
its reductions keeps BLOCK lane accumulators: lane j folds elements j, j + BLOCK,
j + 2 BLOCK, ... in increasing order, then a pairwise tree combines the lanes: at each level
lane i becomes lane 2i + lane 2i+1 (`combine_lanes`). BLOCK is a function of LENGTH alone, so
the tree is too, and it does not depend on the register layout Triton picks: no timing, no
atomics. A row that fits one chunk is read once and every
phase reuses it. The reductions of a phase become per-row values `row(k)` that later phases
and the per-row stores read: softmax is max, then the sum of exponentials, then the stores.

A single-phase reduction of very long rows with few of them (a global norm) is split: P
programs per row each reduce a fixed CHUNK of elements, and a second row kernel reduces the
P partial results the same way. P depends on the shape alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from sexpgpu.backends.cuda.codegen.compile import GeneratedKernel, module_source, signature
from sexpgpu.backends.cuda.codegen.expr import Expr, load, nodes_in_order, operand_views, shift_operands
from sexpgpu.backends.cuda.codegen.flat import iota_source, lane_offset, load_source, store_source
from sexpgpu.backends.cuda.codegen.render import Renderer
from sexpgpu.backends.cuda.codegen.space import (View, contiguous, needs_wide_index, numel, offset_expression,
                                                 power_of_two_block)

COMBINE = {"sum": "add", "max": "max_nan", "min": "min_nan"}
INITIAL = {"sum": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}
MAX_BLOCK = 2048
SPLIT_CHUNK = 16384
SPLIT_MIN_LENGTH = 65536
SPLIT_MAX_ROWS = 64


@dataclass(frozen=True)
class Reduction:
    kind: str  # sum, max or min
    value: Expr


@dataclass(frozen=True)
class Phase:
    reductions: tuple[Reduction, ...] = ()
    stores: tuple[tuple[int, Expr], ...] = ()  # (output number, the value at each element)


@dataclass(frozen=True)
class RowSpec:
    """Operands are the inputs (storage dtypes) then the outputs ((view over `shape`,
    storage dtype)). A per-row output has stride 0 along the reduced axes."""

    shape: tuple[int, ...]
    reduced_rank: int
    inputs: tuple[str, ...]
    outputs: tuple[tuple[View, str], ...]
    phases: tuple[Phase, ...]
    row_stores: tuple[tuple[int, Expr], ...] = ()  # (output number, a per-row value)

    @property
    def lead(self) -> tuple[int, ...]:
        return tuple(self.shape[:len(self.shape) - self.reduced_rank])

    @property
    def reduced(self) -> tuple[int, ...]:
        return tuple(self.shape[len(self.shape) - self.reduced_rank:])

    @property
    def rows(self) -> int:
        return numel(self.lead)

    @property
    def length(self) -> int:
        return numel(self.reduced)

    def roots(self) -> list[Expr]:
        values = [reduction.value for phase in self.phases for reduction in phase.reductions]
        values += [value for phase in self.phases for _, value in phase.stores]
        return values + [value for _, value in self.row_stores]


def combine_lanes(lanes: str, result: str, kind: str, shape: list[int]) -> list[str]:
    """Lines reducing `lanes` (of `shape`, the reduced axis first and a power of two) along
    its first axis (with tl.reduce and bits.add: generated kernels call no function of
    triton.language.standard, see compile.py). A sum is a pairwise tree written out: at each level lane i of the
    result is (lane 2i + lane 2i+1), so the order is the same whatever register layout
    Triton gives the lanes (its own tl.reduce order follows the layout, which follows how
    the loads walk memory). max and min do not depend on order."""
    if kind != "sum":
        return [f"    {result} = tl.reduce({lanes}, 0, {COMBINE[kind]})"]
    lines, width, rest = [], shape[0], shape[1:]
    current = lanes
    while width > 2:
        width //= 2
        dims = ", ".join(str(size) for size in [width, 2] + rest)
        lines.append(f"    {result} = tl.reduce(tl.reshape({current}, [{dims}]), 1, add)")
        current = result
    lines.append(f"    {result} = tl.reduce({current}, 0, add)")  # the last pair
    return lines


def with_roots(spec: RowSpec, roots, inputs) -> RowSpec:
    """The spec with its expressions replaced, in the order of `spec.roots()`, and the
    operands' storage dtypes `inputs`."""
    values = iter(roots)
    phases = tuple(Phase(tuple(Reduction(reduction.kind, next(values)) for reduction in phase.reductions), ())
                   for phase in spec.phases)
    phases = tuple(Phase(phase.reductions, tuple((output, next(values)) for output, _ in original.stores))
                   for phase, original in zip(phases, spec.phases))
    row_stores = tuple((output, next(values)) for output, _ in spec.row_stores)
    return RowSpec(spec.shape, spec.reduced_rank, tuple(inputs), spec.outputs, phases, row_stores)


def block_for(length: int) -> tuple[int, int]:
    """(BLOCK, warps) for rows of `length`: the fixed launch that fixes the tree."""
    block = power_of_two_block(length, 16, MAX_BLOCK)
    warps = 1 if block <= 128 else 2 if block <= 512 else 4 if block <= 1024 else 8
    return block, warps


class _RowSource:
    def __init__(self, spec: RowSpec, split: int = 1, partial_outputs: int = 0):
        self.spec = spec
        self.split = split
        self.block, self.warps = block_for(spec.length if split == 1 else SPLIT_CHUNK)
        self.single = split == 1 and spec.length <= self.block
        outputs = partial_outputs or len(spec.outputs)
        self.pointers = [f"p{index}" for index in range(len(spec.inputs) + outputs)]
        self.renderer = Renderer(self._leaf)
        self.lines: list[str] = []

    # --- where elements are ---------------------------------------------------------------

    def _split_view(self, view: View) -> tuple[str, str | None]:
        """(the per-row part, the per-element part or None) of a view's offset."""
        rank = self.spec.reduced_rank
        if not view.over(self.spec.shape):
            flat = f"(r * {self.spec.length} + c)"
            return offset_expression(flat, view.dims, view.strides, view.offset), "0"
        row_part = offset_expression("r", self.spec.lead, view.strides[:len(view.strides) - rank], view.offset)
        element_part = offset_expression("c", self.spec.reduced, view.strides[len(view.strides) - rank:])
        return row_part, None if element_part == "0" else element_part

    def _offset(self, view: View) -> str:
        row_part, element_part = self._split_view(view)
        if element_part is None or element_part == "0":
            return row_part
        return element_part if row_part == "0" else f"{row_part} + {element_part}"

    def _varies(self, node: Expr) -> bool:
        if node.op in ("load", "iota"):
            view = node.attr[1] if node.op == "load" else node.attr
            return self._split_view(view)[1] is not None
        return False

    def _leaf(self, node: Expr, args) -> str:
        if node.op == "load":
            operand, view = node.attr
            mask = "cmask" if self._varies(node) else None
            return load_source(self.pointers[operand], self.spec.inputs[operand], self._offset(view), mask)
        if node.op == "iota":
            return iota_source(self._offset(node.attr))
        if node.op == "row":
            return f"s{node.attr}"
        if node.op == "scalar":
            return load_source(self.pointers[node.attr], self.spec.inputs[node.attr], "0", None)
        raise ValueError(f"a row kernel cannot read {node.op}")

    def _varying(self, roots) -> set:
        """Nodes that differ between the elements of a row; the rest are computed once a row."""
        varying = set()
        for node in nodes_in_order(roots):
            if self._varies(node) or any(child in varying for child in node.args):
                varying.add(node)
        return varying

    # --- the kernel -----------------------------------------------------------------------

    def source(self) -> str:
        roots = self.spec.roots()
        wide = needs_wide_index(self.spec.shape, operand_views(roots) + [view for view, _ in self.spec.outputs])
        head = [
            "@triton.jit",
            "",  # the signature, once the body says whether it reads the numerics table
            "    r = tl.program_id(0).to(tl.int64)" if wide else "    r = tl.program_id(0)",
            f"    lanes = tl.arange(0, {self.block})",
        ]
        if self.split > 1:
            head.append("    part = tl.program_id(1)")
        if self.single:
            head += ["    c = lanes", f"    cmask = c < {self.spec.length}"]
        number = 0
        for phase in self.spec.phases:
            self._phase(phase, number)
            number += len(phase.reductions)
        if self.split > 1:
            self._partial_stores(number)
        else:
            self._row_stores()
        head[1] = signature(self.pointers, self.renderer.uses_table)
        return module_source(self.renderer.imports, head + self.lines)

    def _phase(self, phase: Phase, first: int) -> None:
        if self.single:
            self.lines += self._accumulate(self.renderer, phase, first, "a{n} = {masked}")
        else:
            self._phase_in_chunks(phase, first)
        for number, reduction in enumerate(phase.reductions, first):
            self.lines += combine_lanes(f"a{number}", f"s{number}", reduction.kind, [self.block])

    def _phase_in_chunks(self, phase: Phase, first: int) -> None:
        roots = [reduction.value for reduction in phase.reductions] + [value for _, value in phase.stores]
        varying = self._varying(roots)
        for node in nodes_in_order(roots):
            if node not in varying:
                self.renderer.value(node)
        self._flush()
        for number, reduction in enumerate(phase.reductions, first):
            self.lines.append(f"    a{number} = tl.full([{self.block}], {INITIAL[reduction.kind]}, tl.float32)")
        if self.split > 1:
            self.lines.append(f"    for c0 in range(0, {SPLIT_CHUNK}, {self.block}):")
            self.lines.append(f"        c = part * {SPLIT_CHUNK} + c0 + lanes")
        else:
            self.lines.append(f"    for c0 in range(0, {self.spec.length}, {self.block}):")
            self.lines.append("        c = c0 + lanes")
        self.lines.append(f"        cmask = c < {self.spec.length}")
        body = self.renderer.scoped()
        self.lines += self._accumulate(body, phase, first, "a{n} = {combine}(a{n}, {masked})")

    def _accumulate(self, body: Renderer, phase: Phase, first: int, update: str) -> list[str]:
        """The lines that fold each element into the lane accumulators and store the
        phase's element outputs."""
        updates = []
        for number, reduction in enumerate(phase.reductions, first):
            value = body.value(reduction.value)
            masked = f"tl.where(cmask, {value}, {INITIAL[reduction.kind]})"
            updates.append(body.indent + update.format(n=number, combine=COMBINE[reduction.kind], masked=masked))
        for output, value in phase.stores:
            name = body.value(value)
            view, dtype = self.spec.outputs[output]
            pointer = self.pointers[len(self.spec.inputs) + output]
            offset = lane_offset("c", self._offset(view), self._split_view(view)[1] is not None)
            updates.append(body.indent + store_source(pointer, dtype, offset, name, "cmask"))
        lines = body.lines + updates
        body.lines = []
        return lines

    def _row_stores(self) -> None:
        for output, value in self.spec.row_stores:
            name = self.renderer.value(value)
            view, dtype = self.spec.outputs[output]
            pointer = self.pointers[len(self.spec.inputs) + output]
            offset = self._split_view(view)[0]
            self.renderer.lines.append("    " + store_source(pointer, dtype, offset, name, None))
        self._flush()

    def _partial_stores(self, count: int) -> None:
        for number in range(count):
            pointer = self.pointers[len(self.spec.inputs) + number]
            self.lines.append(f"    tl.store({pointer} + r * {self.split} + part, s{number})")

    def _flush(self) -> None:
        self.lines += self.renderer.lines
        self.renderer.lines = []


def split_count(spec: RowSpec) -> int:
    """How many programs share one row: 1 except for a few very long reduction-only rows."""
    only_reductions = len(spec.phases) == 1 and not spec.phases[0].stores
    if only_reductions and spec.length >= SPLIT_MIN_LENGTH and spec.rows <= SPLIT_MAX_ROWS:
        return -(-spec.length // SPLIT_CHUNK)
    return 1


def _second_stage(spec: RowSpec, parts: int) -> RowSpec:
    """The reduction of the partial results, then the original per-row stores (which read
    only per-row values, scalars and constants)."""
    reductions = spec.phases[0].reductions
    count = len(reductions)
    shape = spec.lead + (parts,)
    partial_view = contiguous(shape)
    phase = Phase(tuple(Reduction(reduction.kind, load(number, partial_view)) for number, reduction in enumerate(reductions)))
    stores = tuple((output, shift_operands(value, count)) for output, value in spec.row_stores)
    outputs = tuple((View(shape, view.strides[:len(spec.lead)] + (0,), view.offset), dtype) for view, dtype in spec.outputs)
    return RowSpec(shape, 1, ("f32",) * count + spec.inputs, outputs, (phase,), stores)


class RowKernel:
    """A row spec ready to launch: `kernel(*inputs, *outputs)`. Its sources are generated
    at the first launch (or when `kernels` is first read), so a spec the lowering merges
    into a larger kernel (rowmerge.py) costs nothing."""

    def __init__(self, spec: RowSpec):
        self.spec = spec
        self.parts = split_count(spec)
        self._kernels = None

    @property
    def kernels(self) -> list:
        if self._kernels is None:
            self._kernels = self._build()
        return self._kernels

    def _build(self) -> list:
        spec = self.spec
        if self.parts == 1:
            source = _RowSource(spec)
            return [GeneratedKernel(source.source(), (max(spec.rows, 1),), source.warps, "rows")]
        count = len(spec.phases[0].reductions)
        first = _RowSource(spec, self.parts, count)
        second = _RowSource(_second_stage(spec, self.parts))
        return [GeneratedKernel(first.source(), (spec.rows, self.parts), first.warps, "rows-partial"),
                GeneratedKernel(second.source(), (spec.rows,), second.warps, "rows-final")]

    def __call__(self, *operands) -> None:
        if self.parts == 1:
            self.kernels[0](*operands)
            return
        import torch

        inputs = operands[:len(self.spec.inputs)]
        outputs = operands[len(self.spec.inputs):]
        count = len(self.spec.phases[0].reductions)
        partials = [torch.empty((self.spec.rows, self.parts), dtype=torch.float32, device=outputs[0].device)
                    for _ in range(count)]
        self.kernels[0](*inputs, *partials)
        self.kernels[1](*partials, *inputs, *outputs)
