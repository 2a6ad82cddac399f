"""The differential test on a GPU: thousands of random graphs over every op
(tests/cuda/random_graphs.py, the "gpu" profile: odd and large sizes, rows longer than a row
kernel's block, columns longer than a column kernel's chunk, reductions long enough to be
split), the CUDA backend against the CPU interpreter within the tolerances of
tests/op_cases.py. It prints one summary line: graphs run, ops covered, mismatches.

    PYTHONPATH=src python3 -m pytest tests/cuda/test_random_graphs_gpu.py -m gpu -q

Settings: SEXPGPU_DIFF_GRAPHS (default 2000) graphs, seeds 0 to N - 1; SEXPGPU_DIFF_WORKERS
processes (default: the CPU count, at most 16), each with its own backend on the one GPU,
since compiling each graph's kernels is most of the time; SEXPGPU_DIFF_SECONDS (default 480):
no graph starts after that, and the test then fails unless 1000 graphs (or all) ran.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from random_graphs import OP_NAMES, run_seeds, summary  # noqa: E402

COUNT = int(os.environ.get("SEXPGPU_DIFF_GRAPHS", "2000"))
WORKERS = int(os.environ.get("SEXPGPU_DIFF_WORKERS", str(min(16, os.cpu_count() or 1))))
SECONDS = float(os.environ.get("SEXPGPU_DIFF_SECONDS", "480"))
ENOUGH = min(COUNT, 1000)


def test_thousands_of_random_graphs_match_the_interpreter(capsys, monkeypatch):
    monkeypatch.setenv("SEXPGPU_CPU_THREADS", "1")  # the workers' interpreters: one thread each, one worker a core
    start = time.time()
    shares = [range(worker, COUNT, WORKERS) for worker in range(WORKERS)]  # each a mix of ops and sizes
    spawn = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with ProcessPoolExecutor(WORKERS, mp_context=spawn) as pool:
        results = pool.map(run_seeds, shares, itertools.repeat("gpu"), itertools.repeat("cuda"),
                           itertools.repeat(start + SECONDS))
        outcomes = sorted(itertools.chain.from_iterable(results), key=lambda outcome: outcome.seed)
    line = summary(outcomes, f"gpu, {torch.cuda.get_device_name()}, {WORKERS} workers", time.time() - start, COUNT)
    with capsys.disabled():
        print("\n" + line)
    assert not [outcome for outcome in outcomes if outcome.failures], line
    assert len(outcomes) >= ENOUGH, f"{line}\nthe time ran out: raise SEXPGPU_DIFF_SECONDS or SEXPGPU_DIFF_WORKERS"
    assert frozenset().union(*(outcome.ops for outcome in outcomes)) >= frozenset(OP_NAMES), line
