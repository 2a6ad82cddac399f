"""An allocation on the host that fails during a command (numpy's MemoryError): E-MEM-003.

The memory plan was checked before the first step (plan/fit.py, E-MEM-002), but it counts
the graphs' values, not a kernel's scratch, Python's own memory or another process's, so an
allocation may still fail; the run stops where it was, and what it wrote before stays."""

from __future__ import annotations

from sexpgpu.errors import SexpgpuError


def allocation_failed_on_host(error: MemoryError, doing: str) -> SexpgpuError:
    """E-MEM-003 for a MemoryError raised while `doing` ("at step 3")."""
    detail = str(error).splitlines()[0] if str(error) else "MemoryError"
    return SexpgpuError("E-MEM-003", f"memory: allocation failed on the host {doing} ({detail}); the run stopped "
                                     "there, and what it wrote before stays as it was.",
                        hint="Use a smaller :batch (more :microbatches keep the records of a step), or run where more "
                             "memory is free.")
