"""How long an S3 request may take, and what the user sees while it waits.

Three bounds, from the settings table (docs/settings.md): each attempt of a request waits at
most SEXPGPU_S3_TIMEOUT / SEXPGPU_S3_ATTEMPTS for each read (and at most 10 s to connect),
botocore makes at most SEXPGPU_S3_ATTEMPTS attempts (its standard retries), and the request
as a whole, attempts and the pauses between them included, stops waiting after
SEXPGPU_S3_TIMEOUT: `answer` raises Stalled, which s3_objects reports as E-S3-001.

The deadline is kept by the caller, not by botocore: a server that answers a byte at a time
satisfies every per-read timeout and would hold the request for ever. The request runs on a
thread of its own, and the caller waits for it; after SEXPGPU_S3_NOTICE seconds without an
answer, and again every SEXPGPU_S3_NOTICE seconds, it says on stderr (or to the sink a run
installs with `lines_to`, beside its progress) what it is waiting for. botocore cannot cancel
a request in flight: at the deadline its thread is left to end with its connection.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from sexpgpu import settings
from sexpgpu.errors import redact

CONNECT_TIMEOUT = 10.0  # seconds; the most an attempt waits to connect


@dataclass(frozen=True)
class Patience:
    deadline: float = 120.0  # SEXPGPU_S3_TIMEOUT: a request's whole wait
    attempts: int = 3  # SEXPGPU_S3_ATTEMPTS
    notice: float = 10.0  # SEXPGPU_S3_NOTICE: seconds without an answer between lines

    @classmethod
    def from_env(cls) -> "Patience":
        default = cls()
        return cls(settings.value("SEXPGPU_S3_TIMEOUT") or default.deadline,
                   settings.value("SEXPGPU_S3_ATTEMPTS") or default.attempts,
                   settings.value("SEXPGPU_S3_NOTICE") or default.notice)

    def client_config(self) -> dict:
        """botocore Config arguments: each attempt's timeouts and the attempts."""
        per_attempt = self.deadline / self.attempts
        return {"connect_timeout": min(CONNECT_TIMEOUT, per_attempt), "read_timeout": per_attempt,
                "retries": {"total_max_attempts": self.attempts, "mode": "standard"}}


class Stalled(Exception):
    """A request had no answer within its deadline."""

    def __init__(self, deadline: float):
        super().__init__(f"no answer within SEXPGPU_S3_TIMEOUT ({deadline:g} s)")


_sinks: list = []  # the innermost `lines_to` sink last; none: stderr


@contextmanager
def lines_to(say):
    """Inside, the waiting lines go to say(line) (a run's progress) instead of stderr."""
    _sinks.append(say)
    try:
        yield
    finally:
        _sinks.remove(say)


def _say(line: str) -> None:
    if _sinks:
        _sinks[-1](line)
    else:
        print(line, file=sys.stderr, flush=True)


def answer(call, endpoint: str, what: str, patience: Patience):
    """call()'s result or exception, waited for at most patience.deadline seconds (else
    Stalled), saying what it waits for at every patience.notice seconds without an answer."""
    outcome: dict = {}
    done = threading.Event()

    def request():
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = error
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=request, name=f"S3 {what}"[:60], daemon=True).start()
    while not done.wait(min(patience.notice, max(0.0, started + patience.deadline - time.monotonic()))):
        waited = time.monotonic() - started
        if waited >= patience.deadline:
            raise Stalled(patience.deadline)
        _say(redact(f"waiting for S3 endpoint {endpoint}: {what}, {waited:.0f} s so far, "
                    f"giving up after {patience.deadline:g} s"))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
