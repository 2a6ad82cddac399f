"""The metrics log: `metrics.jsonl`, one JSON object a line, written as each step ends.

It holds only values that are functions of the file (no timings), so two runs of the same
file, selection and flags give identical logs.
"""

from __future__ import annotations

import json
import os

import numpy as np


def float_bits(value) -> str:
    """The float32 bit pattern, so that logs compare exactly without parsing decimals."""
    return f"{int(np.float32(value).view(np.uint32)):08x}"


class MetricsLog:
    def __init__(self, path: str, append: bool = False):
        self.path = path
        self.handle = open(path, "a" if append else "w", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.handle.write(json.dumps(record, sort_keys=False) + "\n")
        self.handle.flush()

    def sync(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


def truncate_after_step(path: str, step: int) -> None:
    """Drop the lines of steps after `step`: a resumed run rewrites them, bit for bit."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as handle:
        lines = handle.readlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break  # a line torn by a crash ends the log
        if record.get("step", 0) > step:
            break
        kept.append(line)
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(kept)
