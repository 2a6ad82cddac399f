"""Which rounding path the fast products take when a test or benchmark forces one.

    with forced("int8"):     # the tiers alone, on int8 tensor cores (their exact CPU stand-in off CUDA)
    with forced("fp64"):     # the tiers alone, on exact float64 slice products
    with forced("float64"):  # the float64 product and the pair sums for every output it leaves

Unforced, bounded_gemm.py chooses by the data, and float32 results on the device may take the
queued path (queued.py); a forced path always takes the host path.
"""

from __future__ import annotations

import contextlib

TIER_NAMES = ("int8", "fp64")
FLOAT64_ONLY = "float64"
_forced: list[str] = []


def forced_path() -> str | None:
    """The innermost forced name in effect, or None."""
    return _forced[-1] if _forced else None


@contextlib.contextmanager
def forced(name: str):
    """Force the named path (the module's docstring) inside the block."""
    if name not in (*TIER_NAMES, FLOAT64_ONLY):
        known = ", ".join((*TIER_NAMES, FLOAT64_ONLY))
        raise ValueError(f"sexpgpu.exact: no tier products named {name!r}; they are {known}")
    _forced.append(name)
    try:
        yield
    finally:
        _forced.pop()
