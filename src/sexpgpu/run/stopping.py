"""How a run is stopped from outside: Ctrl-C (SIGINT), or SIGTERM (`kill`, a scheduler's
preemption, a container's stop). Both stop it alike: the run ends after the step in hand,
says where it stopped and how to continue, and exits with 128 + the signal's number, as a
shell reports a process that the signal ended.

Python turns SIGINT into KeyboardInterrupt; `sigterm_as_interrupt` makes SIGTERM raise
`Terminated`, a KeyboardInterrupt, so that whatever cleans up after Ctrl-C cleans up after
SIGTERM too.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import NamedTuple


class Stop(NamedTuple):
    name: str  # as the messages say it
    exit_status: int


CTRL_C = Stop("Ctrl-C", 128 + signal.SIGINT)
SIGTERM = Stop("SIGTERM", 128 + signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the program is, as Python raises KeyboardInterrupt for SIGINT."""


def stop_of(interrupt: KeyboardInterrupt) -> Stop:
    return SIGTERM if isinstance(interrupt, Terminated) else CTRL_C


def _terminate(signum, frame) -> None:
    raise Terminated()


@contextmanager
def sigterm_as_interrupt():
    """For the block, SIGTERM raises Terminated; the handler before it comes back after.
    Only the main thread receives signals, so elsewhere this changes nothing."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        yield
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
