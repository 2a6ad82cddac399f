"""The bytes a tensor's elements span, for telling whether two tensors may share memory."""

from __future__ import annotations


def byte_span(tensor) -> tuple[int, int]:
    """The bytes from a tensor's first element to past its last, of any strides (a contiguous
    buffer's bytes exactly)."""
    start = tensor.data_ptr()
    last = sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride())) if tensor.numel() else -1
    return start, start + (last + 1) * tensor.element_size()


def spans_meet(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]
