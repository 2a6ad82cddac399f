"""Progress while a run trains: a bar on a terminal, plain periodic lines elsewhere."""

from __future__ import annotations

import sys
import time


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


class Progress:
    def __init__(self, total_steps: int, first_step: int, records_per_step: int, stream=None, every_seconds=10.0):
        self.total = total_steps
        self.first = first_step
        self.records_per_step = records_per_step
        self.stream = stream or sys.stderr
        self.is_terminal = self.stream.isatty()
        self.every_seconds = every_seconds
        self.started = time.monotonic()
        self.last_line = 0.0

    def update(self, step: int, loss: float) -> None:
        elapsed = time.monotonic() - self.started
        done = step - self.first + 1
        rate = done * self.records_per_step / elapsed if elapsed > 0 else 0.0
        eta = (self.total - step) * elapsed / done if done else 0.0
        if self.is_terminal:
            self._bar(step, loss, rate, eta)
        elif step == self.total or time.monotonic() - self.last_line >= self.every_seconds:
            self.last_line = time.monotonic()
            print(f"step {step}/{self.total}  loss {loss:.6g}  {rate:,.0f} records/s  ETA {_clock(eta)}",
                  file=self.stream, flush=True)

    def _bar(self, step: int, loss: float, rate: float, eta: float) -> None:
        width = 24
        filled = int(width * step / self.total)
        bar = "#" * filled + "-" * (width - filled)
        print(f"\rstep {step}/{self.total} [{bar}] loss {loss:.6g}  {rate:,.0f} records/s  ETA {_clock(eta)} ",
              end="", file=self.stream, flush=True)

    def finish(self) -> None:
        if self.is_terminal:
            print(file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A line that must not be overwritten by the bar (evaluations, checkpoints)."""
        if self.is_terminal:
            print("\r" + " " * 96 + "\r", end="", file=self.stream)
        print(text, file=self.stream, flush=True)
