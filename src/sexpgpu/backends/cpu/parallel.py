"""Large kernels split across CPU threads; numpy releases the GIL inside its loops.

A split never changes bits: every output element is computed by the same operations in the
same order, whichever thread computes it and however many threads there are. The thread
count is the CPU count the process may use (at most 8), or SEXPGPU_CPU_THREADS.

A piece runs in the context of the thread that split the kernel: numpy's error state is a
context variable, so the interpreter's np.errstate reaches its threads (an overflow there is
an IEEE value, as it is in the calling thread, never a warning).
"""

from __future__ import annotations

import contextvars
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from sexpgpu import settings

MIN_ELEMENTS = 1 << 17  # below this a split costs more CPU time than it saves wall time

_pool = None
_AVAILABLE = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def thread_count() -> int:
    return settings.value("SEXPGPU_CPU_THREADS") or max(1, min(_AVAILABLE, 8))


def _executor():
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=thread_count(), thread_name_prefix="sexpgpu-cpu")
    return _pool


def _submit(function, *args):
    """function(*args) on a pool thread, in a copy of this thread's context."""
    return _executor().submit(contextvars.copy_context().run, function, *args)


def ranges(count: int, parts: int) -> list:
    """`parts` contiguous (start, stop) ranges covering range(count), the first ones longest."""
    parts = max(1, min(parts, count))
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def run_ranges(work, count: int, elements: int) -> None:
    """work(start, stop) over a split of range(count), in threads when `elements` is large."""
    threads = 1 if elements < MIN_ELEMENTS or count < 2 else thread_count()
    if threads == 1:
        work(0, count)
        return
    *others, last = ranges(count, threads)
    futures = [_submit(work, start, stop) for start, stop in others]
    work(*last)  # the calling thread takes a piece too, rather than wait idle for the others
    for future in futures:
        future.result()


def elementwise(function, *arrays) -> np.ndarray:
    """function(*arrays) for an elementwise function, computed in slices across threads."""
    if len(arrays) == 1 and arrays[0].size < MIN_ELEMENTS:  # order="C" keeps a 0-d array 0-d
        return np.asarray(function(np.asarray(arrays[0], order="C")))
    shaped = np.broadcast_arrays(*arrays)
    shape = shaped[0].shape
    size = shaped[0].size
    if size < MIN_ELEMENTS or thread_count() == 1:
        return np.asarray(function(*(np.asarray(a, order="C") for a in shaped)))
    flat = [np.ascontiguousarray(a).reshape(-1) for a in shaped]
    futures = [_submit(function, *(a[low:high] for a in flat)) for low, high in ranges(size, thread_count())]
    return np.concatenate([np.asarray(future.result()) for future in futures]).reshape(shape)
