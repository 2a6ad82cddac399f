"""What each process of a world in test_distributed.py runs: `sexpgpu run` in-process, with
the environment torchrun gives a process (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR=127.0.0.1), in a process that run_world (tests/exact) forks from the
test's own. A fork costs no second import of torch, which is most of what a process started
by torchrun costs on two cores; the processes meet through a file (SEXPGPU_DIST_FILE), so
nothing listens beyond the loopback interface, and gloo binds to `lo`."""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from sexpgpu.cli.main import main
from sexpgpu.run import loop
from sexpgpu.run.digest import parameters_digest

CORRUPTED_AFTER = 2  # the step after which a corrupting process flips a bit of its parameters


@dataclass(frozen=True)
class Launch:
    """One world: `sexpgpu ARGV` on `nodes` nodes of `per_node` processes."""

    argv: tuple
    nodes: int = 1
    per_node: int = 1
    env: dict = field(default_factory=dict)  # every process's
    rank_env: dict = field(default_factory=dict)  # rank -> what that process has besides
    corrupt: int | None = None  # the rank whose memory flips a parameter's bit

    @property
    def size(self) -> int:
        return self.nodes * self.per_node

    def environment(self, rank: int, out_dir: str) -> dict:
        """What torchrun would set for `rank`, and where the processes meet."""
        return {"RANK": str(rank), "WORLD_SIZE": str(self.size), "LOCAL_RANK": str(rank % self.per_node),
                "LOCAL_WORLD_SIZE": str(self.per_node), "GROUP_RANK": str(rank // self.per_node),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "GLOO_SOCKET_IFNAME": "lo",
                "SEXPGPU_DIST_FILE": os.path.join(out_dir, "store"), "SEXPGPU_DIST_TIMEOUT": "120",
                "SEXPGPU_CPU_THREADS": "1", **self.env, **self.rank_env.get(rank, {})}


def run_rank(launch: Launch, rank: int, world: int, out_dir: str) -> None:
    """The job run_world forks: records the exit status and what the process printed."""
    os.environ.update(launch.environment(rank, out_dir))
    torch.set_num_threads(1)
    from sexpgpu.backends.cpu import parallel

    parallel._pool = None  # a pool the test's process made has no threads in this one
    if rank == launch.corrupt:
        loop.Trainer._step = _corrupting(loop.Trainer._step)
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        status = main(list(launch.argv))
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    torch.save({"status": status, "out": out.getvalue(), "err": err.getvalue()},
               os.path.join(out_dir, f"rank{rank}.pt"))


def train_rank(launch: Launch, rank: int, world: int, out_dir: str) -> None:
    """The job of a world that trains through the Python API, `sexpgpu.train(FILE,
    device="cpu", run_dir=RUN_DIR)` with launch.argv = (FILE, RUN_DIR): records the RunResult."""
    import sexpgpu

    os.environ.update(launch.environment(rank, out_dir))
    torch.set_num_threads(1)
    from sexpgpu.backends.cpu import parallel

    parallel._pool = None
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        result = sexpgpu.train(launch.argv[0], device="cpu", run_dir=launch.argv[1])
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    torch.save({"run_dir": str(result.run_dir), "step": result.step, "metrics": list(result.metrics),
                "checkpoints": sorted(result.checkpoints), "determinism": result.determinism},
               os.path.join(out_dir, f"rank{rank}.pt"))


def _corrupting(step):
    """Trainer._step with this process's memory flipping one bit of a parameter after a step."""

    def corrupted(self, state):
        record = step(self, state)
        if state.step == CORRUPTED_AFTER:
            path = sorted(state.params)[0]
            flipped = np.array(state.params[path], dtype=np.float32, copy=True)
            flipped.reshape(-1).view(np.uint32)[0] ^= 1
            state.params[path] = flipped
            record["digest"] = parameters_digest(self.backend, state.params)
        return record

    return corrupted
