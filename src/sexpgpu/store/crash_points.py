"""A test seam: stop or slow a checkpoint writer at a named point.

The writers call `reached(point)` at each point below. Two settings (settings.py), for tests
only, act on it:

- `SEXPGPU_TEST_CHECKPOINT_KILL_AT=<point>`: the process sends itself SIGKILL there, which is
  exactly what a crash or a preemption at that moment looks like from the outside;
- `SEXPGPU_TEST_CHECKPOINT_SLEEP=<seconds>`: a pause at every point, so that a test can kill
  the process from outside at a moment of its choosing.

Points, in the order a checkpoint reaches them: `start`, then for each file `mid:<file>`
(part of the file written) and `file:<file>` (the file complete), then `commit` (everything
written, the commit not yet made) and `committed` (before older checkpoints are deleted).
"""

from __future__ import annotations

import os
import signal
import time

from sexpgpu import settings


def reached(point: str) -> None:
    pause = settings.value("SEXPGPU_TEST_CHECKPOINT_SLEEP")
    if pause:
        time.sleep(pause)
    if settings.value("SEXPGPU_TEST_CHECKPOINT_KILL_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
