"""The legality of joining row kernels (fusion.JOINS): row reductions over the same rows, and
the values that read them, in one row kernel; docs/fusion.md, "Row kernels merge", says how.

A reduction over the same space (lead and reduced shape, axis order) joins the row kernel
before it (`merged`): into its phases of the same number when it reads nothing the kernel
writes, or after its last phase when it does, each such read becoming the output's own
expression (`row(k)` for a per-row statistic), rounded as its store rounds. A value written
out after it joins as a store (`add_store`): over the whole space into its last phase, or
per row. A row of at most MAX_BLOCK elements is loaded once for all phases; a longer one is
read once per phase, so there only a reduction reading nothing of the kernel joins, into
phases it has. Every reduction keeps its bits: BLOCK, lanes and tree depend on the row
length alone (rows.block_for), and no kernel that would be split (rows.split_count) joins.
"""

from __future__ import annotations

from dataclasses import dataclass

from sexpgpu.backends.cuda import views
from sexpgpu.backends.cuda.codegen.expr import Expr, cast, map_leaves, nodes_in_order, row
from sexpgpu.backends.cuda.codegen.rows import MAX_BLOCK, Phase, Reduction, RowKernel, RowSpec, split_count
from sexpgpu.backends.cuda.codegen.rows import with_roots
from sexpgpu.backends.cuda.codegen.space import View, contiguous_strides, numel
from sexpgpu.backends.cuda.launches import KernelLaunch, kernel_launch, loads_of

MAX_ELEMENT_OUTPUTS = 8  # stores over the whole space a merged kernel takes


@dataclass
class RowLaunch:
    """A row kernel still open to more reductions and stores; expressions read buffers by key."""

    shape: tuple[int, ...]
    reduced_rank: int
    outputs: list  # (key, view over shape, storage dtype)
    phases: list  # Phase
    row_stores: list  # (output number, per-row value)
    kind: str

    def spec(self, inputs=()) -> RowSpec:
        outputs = tuple((view, dtype) for _, view, dtype in self.outputs)
        return RowSpec(tuple(self.shape), self.reduced_rank, tuple(inputs), outputs, tuple(self.phases),
                       tuple(self.row_stores))

    def roots(self) -> list[Expr]:
        return self.spec().roots()

    @property
    def single(self) -> bool:
        """Whether a row is one chunk, loaded once for every phase."""
        return self.spec().length <= MAX_BLOCK

    @property
    def reads(self) -> tuple[str, ...]:
        return loads_of(self.roots())

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(key for key, _, _ in self.outputs)

    def finish(self, buffers: dict) -> KernelLaunch:
        spec = self.spec()
        return kernel_launch(RowKernel, spec, spec.roots(), with_roots, list(self.writes), buffers, self.kind)


def joinable(launch) -> bool:
    """Whether `launch` is a row kernel that may take more: one that is split would change its
    tree if it did."""
    return isinstance(launch, RowLaunch) and split_count(launch.spec()) == 1


# --- what the open kernel gives its readers ---------------------------------------------------


def _stored(value: Expr, dtype: str) -> Expr | None:
    """The value a load of an output of `dtype` holding `value` reads back."""
    if dtype == "bf16" and value.dtype == "f32":
        return cast(value, "bf16")
    if (dtype, value.dtype) in (("f32", "f32"), ("i32", "i32"), ("bool", "bool")):
        return value
    return None


def _produced(launch: RowLaunch) -> dict:
    """(key, view) -> the expression a read of that output through its own view gives
    (element outputs only where a row is one chunk: elsewhere they are of another pass)."""
    produced = {}
    for number, value in launch.row_stores:
        key, view, dtype = launch.outputs[number]
        produced[(key, view)] = _stored(value, dtype)
    if launch.single:
        for phase in launch.phases:
            for number, value in phase.stores:
                key, view, dtype = launch.outputs[number]
                produced[(key, view)] = _stored(value, dtype)
    return produced


def _reading_outputs(launch: RowLaunch, values) -> tuple[list, bool] | None:
    """(the values with reads of the launch's outputs replaced by their expressions, whether
    any was), or None when one is read in a way the kernel cannot give it."""
    produced, written = _produced(launch), set(launch.writes)
    for node in nodes_in_order(values):
        if node.op == "scalar" and node.attr in written:
            return None
        if node.op == "load" and node.attr[0] in written and produced.get(node.attr) is None:
            return None
    used = [False]

    def leaf(node: Expr) -> Expr:
        if node.op == "load" and node.attr in produced:
            used[0] = True
            return produced[node.attr]
        return node

    memo: dict = {}
    return [map_leaves(value, leaf, memo) for value in values], used[0]


def _renumbered(value: Expr, numbers: dict) -> Expr:
    return map_leaves(value, lambda leaf: row(numbers[leaf.attr]) if leaf.op == "row" else leaf)


# --- a reduction joins ------------------------------------------------------------------------


def merged(first: RowLaunch, second: RowLaunch) -> RowLaunch | None:
    """`first` with `second` (lowered just after it) inside, or None when they cannot share
    a kernel without changing a bit or adding a pass over long rows."""
    if (first.shape, first.reduced_rank) != (second.shape, second.reduced_rank):
        return None
    if set(second.writes) & set(first.reads):
        return None
    reading = _reading_outputs(first, [value for _, value in _flattened(second)])
    if reading is None:
        return None
    dependent = reading[1]
    if dependent and not first.single:
        return None
    result = _combined(first, second, len(first.phases) if dependent else 0)
    return result if split_count(result.spec()) == 1 else None


def _flattened(launch: RowLaunch) -> list:
    """[(place, value)] of every expression of the launch, in a fixed order: ("r", phase,
    kind), ("s", phase, output) and ("row", output)."""
    items = []
    for number, phase in enumerate(launch.phases):
        items += [(("r", number, r.kind), r.value) for r in phase.reductions]
        items += [(("s", number, output), value) for output, value in phase.stores]
    return items + [(("row", output), value) for output, value in launch.row_stores]


def _row_numbers(first: RowLaunch, second: RowLaunch, start: int) -> tuple[dict, dict, int]:
    """Old row number -> new, for each launch, when phase k of `second` becomes phase
    start + k: the kernel numbers rows phase by phase, `first`'s before `second`'s."""
    count = max(len(first.phases), start + len(second.phases))
    numbers: tuple[dict, dict] = ({}, {})
    new = 0
    for index in range(count):
        for which, launch, at in ((0, first, index), (1, second, index - start)):
            if 0 <= at < len(launch.phases):
                for _ in launch.phases[at].reductions:
                    numbers[which][len(numbers[which])] = new
                    new += 1
    return numbers[0], numbers[1], count


def _renumbered_launch(launch: RowLaunch, numbers: dict, shift: int = 0) -> RowLaunch:
    """The launch with its rows renumbered and its output numbers shifted by `shift`."""
    phases = [Phase(tuple(Reduction(r.kind, _renumbered(r.value, numbers)) for r in phase.reductions),
                    tuple((n + shift, _renumbered(v, numbers)) for n, v in phase.stores)) for phase in launch.phases]
    row_stores = [(n + shift, _renumbered(v, numbers)) for n, v in launch.row_stores]
    return RowLaunch(launch.shape, launch.reduced_rank, launch.outputs, phases, row_stores, launch.kind)


def _combined(first: RowLaunch, second: RowLaunch, start: int) -> RowLaunch:
    """Phase k of `second` as phase start + k of the result, its reads of `first`'s outputs
    replaced by their expressions."""
    first_rows, second_rows, count = _row_numbers(first, second, start)
    first = _renumbered_launch(first, first_rows)
    second = _renumbered_launch(second, second_rows, len(first.outputs))
    places = _flattened(second)
    values = _reading_outputs(first, [value for _, value in places])[0]
    phases = [(list(phase.reductions), list(phase.stores)) for phase in first.phases]
    phases += [([], []) for _ in range(count - len(phases))]
    row_stores = list(first.row_stores)
    for (place, _), value in zip(places, values):
        if place[0] == "r":
            phases[start + place[1]][0].append(Reduction(place[2], value))
        elif place[0] == "s":
            phases[start + place[1]][1].append((place[2], value))
        else:
            row_stores.append((place[1], value))
    return RowLaunch(first.shape, first.reduced_rank, first.outputs + second.outputs,
                   [Phase(tuple(reductions), tuple(stores)) for reductions, stores in phases],
                   row_stores, first.kind)


# --- an elementwise value joins ---------------------------------------------------------------


def add_store(launch: RowLaunch, shape, key: str, dtype: str, value: Expr) -> RowLaunch | None:
    """The open kernel with `value` (of `shape`, written to `key`) as one more store, if it
    reads the kernel's outputs only as the kernel can give them; None when it cannot."""
    shape = tuple(shape)
    launch = RowLaunch(launch.shape, launch.reduced_rank, list(launch.outputs), list(launch.phases), list(launch.row_stores),
                   launch.kind)
    if shape == tuple(launch.shape):
        return launch if _element_store(launch, key, dtype, value) else None
    spec = launch.spec()
    if numel(shape) != spec.rows or not shape or shape[:len(spec.lead)] != spec.lead:
        return None
    return launch if _row_store(launch, shape, key, dtype, value) else None


def _element_store(launch: RowLaunch, key: str, dtype: str, value: Expr) -> bool:
    if not launch.single:
        return False
    element_outputs = sum(len(phase.stores) for phase in launch.phases)
    if element_outputs >= MAX_ELEMENT_OUTPUTS or not _related(launch, value):
        return False
    reading = _reading_outputs(launch, [value])
    if reading is None:
        return False
    (value,), _ = reading
    number = len(launch.outputs)
    launch.outputs.append((key, View(tuple(launch.shape), contiguous_strides(launch.shape)), dtype))
    last = launch.phases[-1]
    if last.reductions:
        launch.phases.append(Phase((), ((number, value),)))
    else:
        launch.phases[-1] = Phase((), last.stores + ((number, value),))
    return True


def _related(launch: RowLaunch, value: Expr) -> bool:
    """Whether the value reads a buffer the kernel reads or writes (else it gains nothing)."""
    touched = set(launch.reads) | set(launch.writes)
    return any(key in touched for key in loads_of([value]))


def _row_store(launch: RowLaunch, shape, key: str, dtype: str, value: Expr) -> bool:
    spec = launch.spec()
    lead = spec.lead
    unit = lead + (1,) * spec.reduced_rank
    space = tuple(launch.shape)
    spread = views.through(value, lambda view: views.broadcast(views.reshape(view, shape, unit), unit, space))
    if spread is None or not _per_row(spread, space, len(lead)):
        return False
    reading = _reading_outputs(launch, [spread])
    if reading is None:
        return False
    (spread,), _ = reading
    view = View(space, contiguous_strides(lead) + (0,) * spec.reduced_rank)
    launch.outputs.append((key, view, dtype))
    launch.row_stores.append((len(launch.outputs) - 1, spread))
    return True


def _per_row(value: Expr, space, lead_rank: int) -> bool:
    """Whether every leaf is the same for all elements of a row."""
    for node in nodes_in_order([value]):
        if node.op == "iota":
            return False
        if node.op == "load" and (not node.attr[1].over(space) or any(node.attr[1].strides[lead_rank:])):
            return False
    return True
