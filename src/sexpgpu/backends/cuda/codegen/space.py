"""Where a kernel's operands live: a static iteration space and strided views into buffers.

Every size and stride is known when a graph is lowered, so index arithmetic is generated as
constants. A `View` reads the kernel's flat (row-major) position through its own `dims`:
coordinate k of the position along `dims`, times `strides[k]`, summed, plus `offset`. Its
dims are usually the kernel's space; a value read through a reshape keeps the dims it had
before the reshape, since a reshape keeps every flat position. A stride 0 broadcasts.
"""

from __future__ import annotations

from dataclasses import dataclass

STORAGE_TYPES = {"f32": "tl.float32", "bf16": "tl.bfloat16", "i32": "tl.int32", "i64": "tl.int64", "bool": "tl.int1"}
INT32_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class View:
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    def over(self, shape) -> bool:
        """Whether the view's axes are the axes of `shape` (not a reshape of them)."""
        return tuple(self.dims) == tuple(shape)


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, stride = [], 1
    for size in reversed(tuple(shape)):
        strides.append(stride)
        stride *= max(int(size), 1)
    return tuple(reversed(strides))


def contiguous(shape) -> View:
    return View(tuple(shape), contiguous_strides(shape))


def broadcast_view(operand_shape, space_shape) -> View:
    """A contiguous operand of `operand_shape` broadcast (numpy rules) to `space_shape`."""
    operand_shape, space_shape = tuple(operand_shape), tuple(space_shape)
    own = contiguous_strides(operand_shape)
    missing = len(space_shape) - len(operand_shape)
    strides = [0] * missing
    for size, stride in zip(operand_shape, own):
        strides.append(0 if size == 1 else stride)
    return View(space_shape, tuple(strides))


def unit_view(shape, axis: int) -> View:
    """The coordinate along `axis`, as a view: stride 1 there and 0 elsewhere."""
    return View(tuple(shape), tuple(1 if index == axis else 0 for index in range(len(shape))))


def power_of_two_block(count: int, least: int, most: int) -> int:
    """The smallest power of two from `least` that holds `count` items, but at most `most`
    (`least` and `most` powers of two): a kernel's block along an axis of `count`."""
    block = least
    while block < count and block < most:
        block *= 2
    return block


def numel(shape) -> int:
    total = 1
    for size in shape:
        total *= int(size)
    return total


def collapse(shape, strides) -> list[tuple[int, int]]:
    """(size, stride) pairs with unit axes dropped and axes merged where the view walks
    them as one: the same offsets with fewer divisions."""
    pairs = [(int(size), int(stride)) for size, stride in zip(shape, strides) if int(size) != 1]
    merged: list[tuple[int, int]] = []
    for size, stride in pairs:
        if merged and merged[-1][1] == stride * size:
            outer_size, _ = merged[-1]
            merged[-1] = (outer_size * size, stride)
        else:
            merged.append((size, stride))
    return merged


def offset_expression(index: str, shape, strides, offset: int = 0) -> str:
    """The element offset, as Triton source, of flat (row-major) position `index` of
    `shape` in a view with `strides`."""
    terms = []
    inner = 1
    for size, stride in reversed(collapse(shape, strides)):
        if stride != 0:
            coordinate = index if inner == 1 else f"({index} // {inner})"
            if inner * size < numel(shape):
                coordinate = f"({coordinate} % {size})"
            terms.append(coordinate if stride == 1 else f"{coordinate} * {stride}")
        inner *= size
    if offset:
        terms.append(str(offset))
    return " + ".join(reversed(terms)) if terms else "0"


def view_offset(index: str, view: View) -> str:
    return offset_expression(index, view.dims, view.strides, view.offset)


def needs_wide_index(shape, views) -> bool:
    """Whether offsets can pass 2^31 - 1, so the kernel indexes in int64."""
    if numel(shape) > INT32_LIMIT:
        return True
    for view in views:
        extent = view.offset + sum((int(size) - 1) * abs(stride) for size, stride in zip(view.dims, view.strides))
        if extent > INT32_LIMIT:
            return True
    return False
