"""The benchmarks' smoke mode: every script in bench/ takes `--smoke`, which runs it at its
tiniest (the smallest model or size, one step, one repetition) and prints its table and ratios
as at full size, so that tests/bench/test_bench_smoke.py can run every script in CI and a
broken one fails there. A smoke run's figures mean nothing.

Without a GPU a smoke run takes whatever CPU path the script has: Triton's kernels run in its
interpreter (TRITON_INTERPRET=1: importing this module with --smoke on the command line sets
it, so import it before anything that decorates a kernel), PyTorch peers run on the CPU, and
the CUDA backend's rows run on the CPU interpreter instead where the script says so. A part
with no CPU path is skipped with a line that says what and why:

    smoke: skipped <what>: <why>
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP = ("the tiniest sizes, one step, one repetition, on the CPU where there is no GPU: checks that the "
        "script runs; its figures mean nothing")
NO_GPU = "no CUDA GPU here"

# examples/char-lm.sexp cut to milliseconds a step on the CPU interpreter, and its PyTorch peer's options
TINY_CHAR_LM = {":context 64 :width 64 :heads 4 :ff 256 :layers 2": ":context 4 :width 8 :heads 2 :ff 8 :layers 1",
                ":width 64 :heads 4 :ff 256": ":width 8 :heads 2 :ff 8",
                "(text pydoc :context 64)": "(text pydoc :context 4)", ":batch 16": ":batch 2"}
TINY_CHAR_LM_PEER = dict(vocab=256, context=4, width=8, heads=2, ff=8, layers=1)


def requested(argv=None) -> bool:
    return "--smoke" in (sys.argv[1:] if argv is None else argv)


def add_option(parser) -> None:
    parser.add_argument("--smoke", action="store_true", help=HELP)


def gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def skipped(what: str, why: str = NO_GPU) -> None:
    print(f"smoke: skipped {what}: {why}", flush=True)


def edited_experiment(path: Path, edits: dict):
    """The experiment of the file at `path` with each of `edits` (text: replacement) made."""
    from sexpgpu.lang.forms import parse_experiment, select_run
    from sexpgpu.lang.reader import read_text

    text = path.read_text()
    for old, new in edits.items():
        if old not in text:
            raise ValueError(f"{path.name} no longer holds {old!r}: update the benchmark's edits")
        text = text.replace(old, new)
    return select_run(parse_experiment(read_text(text, str(path)), str(path), ""), None)


if requested() and not os.environ.get("TRITON_INTERPRET") and not gpu():
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton decorates a kernel of sexpgpu's
