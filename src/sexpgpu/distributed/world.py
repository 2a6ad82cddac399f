"""The processes of a data-parallel run: who this process is among them, and every sum and
comparison between them (docs/distributed.md).

`torchrun --nnodes N --nproc-per-node G -m sexpgpu run FILE` starts N·G processes with the
standard torch.distributed environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR, MASTER_PORT). `World.from_environment` reads it; without
WORLD_SIZE a run is one process, `World.SOLO`, and nothing here imports torch or joins
anything, so a one-process run is today's run, at today's cost.

A step of a world (run/loop.py) runs on each rank the contiguous share of its microbatches
`World.share` gives, sums them in order as one process would, then `RankSums` combines the
ranks' sums with a fixed order of its own, so that the bits are a function of the
configuration and not of NCCL's or gloo's reduction algorithm:
- within a node, every rank's float32 sums are gathered and added in rank order;
- between nodes, each node's sum goes as float32 or, under SEXPGPU_NODE_GRADIENTS=bf16,
  rounded to bfloat16 with the rounding carried into its next step (error feedback), and
  the nodes' values are added in node order;
- under `:arithmetic exact` the gradients are acc values (graph/passes/exact_region.py), each
  rank's sum of its calls by the `accumulate` graph; they are summed exactly here
  (`det_all_reduce`), the one step between that graph and the `rounding` graph, so the
  number of processes changes no bit;
- the microbatches' losses are gathered and averaged in global microbatch order.
Gathering every rank's gradient costs bandwidth an all-reduce would not (each process
receives the whole gradient of every other one on its node); it buys bits that no
collective's algorithm can change.

Rank 0 alone writes the run directory. Every rank compares its parameter digest with the
others' after every step (E-DIST-006), and what fails on one rank while the others wait is
shared with them (`Joined.settled`), so that every process stops with a coded error.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple

import numpy as np

from sexpgpu import settings
from sexpgpu.errors import SexpgpuError

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}  # the process group's backend for the device the run computes on
NOUNS = {"cpu": "processes", "cuda": "GPUs"}
LAUNCHER_HINT = "Start the run with torchrun (docs/distributed.md), which sets these variables, or unset WORLD_SIZE."
DEFAULT_TIMEOUT = 600.0  # seconds, SEXPGPU_DIST_TIMEOUT


class OneProcess:
    """A step's sums across processes when the run is one: it runs every microbatch, and
    there is nothing to combine. RankSums below is the same for several."""

    @staticmethod
    def share(microbatches: int) -> range:
        return range(microbatches)

    @staticmethod
    def gradients(total: dict) -> dict:
        return total

    @staticmethod
    def losses(values: list) -> list:
        return values


@dataclass(frozen=True)
class World:
    """This process among the run's processes. Ranks are numbered node by node, as torchrun
    numbers them: rank = node * local_size + local_rank."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0  # torchrun's GROUP_RANK
    nodes: int = 1
    meeting: str = ""  # the init method: "env://" (torchrun's store), "file://PATH", or "" for one process
    backend: str = ""  # "gloo" or "nccl" once the device is known (`on`)

    SOLO: ClassVar["World"]

    @property
    def distributed(self) -> bool:
        return bool(self.meeting)

    @property
    def several(self) -> bool:
        return self.size > 1

    def on(self, kind: str) -> "World":
        """The world with the process group's backend for the device kind the run computes on."""
        return replace(self, backend=BACKENDS[kind])

    def share(self, microbatches: int) -> range:
        """The global microbatch indices this rank runs: its contiguous M/W of them."""
        each = microbatches // self.size
        return range(self.rank * each, (self.rank + 1) * each)

    def check_share(self, microbatches: int) -> None:
        if microbatches % self.size:
            raise SexpgpuError("E-DIST-002", f"the run's {microbatches} microbatches a step do not divide among "
                                             f"{self.size} processes: each process runs an equal share of them.",
                               hint=f"Give :microbatches a multiple of {self.size}, or start as many processes as "
                                    "divide it.")

    def to_json(self) -> dict:
        """What a run's records (experiment.json, each checkpoint's) say of its world."""
        return {"processes": self.size, "nodes": self.nodes}

    def described(self, kind: str) -> str:
        """What the recorded device says of the world: '2 GPUs on 1 node', '' for one process."""
        if not self.several:
            return ""
        return f"{self.size} {NOUNS[kind]} on {self.nodes} node{'s' if self.nodes > 1 else ''}"

    @classmethod
    def from_environment(cls, environ=None) -> "World":
        """The world torchrun describes, SOLO without WORLD_SIZE, or E-DIST-001."""
        environ = os.environ if environ is None else environ
        if not environ.get("WORLD_SIZE", "").strip():
            return cls.SOLO
        size, rank, local_rank, local_size = (_integer(environ, name)
                                              for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
        node = _integer(environ, "GROUP_RANK") if environ.get("GROUP_RANK", "").strip() else rank // max(local_size, 1)
        world = cls(rank, size, local_rank, local_size, node, size // max(local_size, 1))
        why = _not_a_world(world)
        if why:
            raise SexpgpuError("E-DIST-001", f"the launcher's environment does not describe this process: {why}.",
                               hint=LAUNCHER_HINT)
        return replace(world, meeting=_meeting(environ))


World.SOLO = World()


def _not_a_world(world: World) -> str | None:
    """Why the numbers do not describe a process of a world numbered node by node, or None."""
    size, rank, local_rank, local_size, node = world.size, world.rank, world.local_rank, world.local_size, world.node
    for broken, why in (
        (size < 1 or local_size < 1, "WORLD_SIZE and LOCAL_WORLD_SIZE must be at least 1"),
        (not rank < size, f"RANK {rank} is not below WORLD_SIZE {size}"),
        (not local_rank < local_size, f"LOCAL_RANK {local_rank} is not below LOCAL_WORLD_SIZE {local_size}"),
        (size % max(local_size, 1),
         f"WORLD_SIZE {size} is not a multiple of LOCAL_WORLD_SIZE {local_size}: every node must run as many processes"),
        (rank != node * local_size + local_rank,
         f"RANK {rank} is not GROUP_RANK {node} times LOCAL_WORLD_SIZE {local_size} plus LOCAL_RANK {local_rank}: "
         "ranks must be numbered node by node"),
    ):
        if broken:
            return why
    return None


def _integer(environ, name: str) -> int:
    text = environ.get(name, "").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        shown = "unset" if not text else f"'{text[:40]}'"
        raise SexpgpuError("E-DIST-001", f"the launcher's environment does not describe this process: {name} is "
                                         f"{shown}, where a run of several processes needs a whole number.",
                           hint=LAUNCHER_HINT)
    return int(text)


def _meeting(environ) -> str:
    """Where the processes meet: the file SEXPGPU_DIST_FILE names, else torchrun's store."""
    path = settings.value("SEXPGPU_DIST_FILE", environ)
    if path:
        return f"file://{os.path.abspath(path)}"
    port = environ.get("MASTER_PORT", "").strip()
    if not environ.get("MASTER_ADDR", "").strip() or not (port.isascii() and port.isdigit()) or \
            not 0 < int(port) < 65536:
        raise SexpgpuError("E-DIST-001", "the launcher's environment does not describe this process: MASTER_ADDR "
                                         f"and MASTER_PORT must name where the processes meet (found "
                                         f"{environ.get('MASTER_ADDR', '')[:40]!r} and {port[:10]!r}).",
                           hint=LAUNCHER_HINT)
    return "env://"


class GroupFacts(NamedTuple):
    """What decides whether a process group can use a device here."""

    cuda_problem: str | None  # why the CUDA backend cannot run here (backends/select.py), None when it can
    gpus: int  # the GPUs this node shows
    backends: tuple  # the process group backends this torch has
    torch: str  # torch's version, "" when torch.distributed cannot be imported


def group_facts(device: str) -> GroupFacts:
    from sexpgpu.backends.select import cuda_problem

    problem = cuda_problem() if device != "cpu" else "not asked: --device cpu"
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return GroupFacts(problem, 0, (), "")
    offered = tuple(name for name, available in (("gloo", dist.is_gloo_available), ("nccl", dist.is_nccl_available))
                    if available())
    return GroupFacts(problem, torch.cuda.device_count() if problem is None else 0, offered, torch.__version__)


def process_device(world: World, device: str, facts: GroupFacts | None = None) -> str:
    """The device kind a process of `world` computes on: `--device` resolved as
    select_backend resolves it, or E-DIST-003 when the process group cannot use it."""
    facts = facts or group_facts(device)
    kind = "cuda" if device == "cuda" or (device == "auto" and facts.cuda_problem is None) else "cpu"
    if kind == "cuda" and facts.cuda_problem is not None:
        return kind  # select_backend says why (E-DEVICE-001)
    backend = BACKENDS[kind]
    for broken, why in (
        (not facts.torch, "torch.distributed cannot be imported"),
        (backend not in facts.backends, f"this torch ({facts.torch}) has no {backend}"),
        (kind == "cuda" and not world.local_rank < facts.gpus,
         f"LOCAL_RANK {world.local_rank} has no GPU of its own: this node shows {facts.gpus}"),
    ):
        if broken:
            raise SexpgpuError("E-DIST-003", f"a process computing on {kind} cannot join the run's {backend} process "
                                             f"group: {why}.",
                               hint="Start at most one process per GPU (--nproc-per-node), install a torch with "
                                    f"{backend}, or choose the other device with --device.")
    return kind


# --- the process group --------------------------------------------------------------------

class Alone:
    """The group of a one-process run: nothing to join, compare or share. Joined has the
    same methods for several."""

    world = World.SOLO
    first = True
    gpu = None

    @staticmethod
    def across(sums, node_gradients: str, exact: bool):
        return OneProcess

    def check_same(self, what: str, payload: bytes) -> None:
        pass

    def from_first(self, make, doing: str):
        return make()

    def settled(self, doing: str):
        return nullcontext()

    def check_parameters(self, step: int, digest: str) -> None:
        pass

    def join(self) -> None:
        pass

    def leave(self) -> None:
        pass


@contextmanager
def joined(world: World, kind: str):
    """The run's process group for the block: Alone for one process; else this process
    joins the others (E-DIST-004 when it cannot within SEXPGPU_DIST_TIMEOUT) and leaves at
    the end of the block, however it ends."""
    group = Joined(world.on(kind), kind) if world.distributed else Alone()
    try:
        group.join()
        yield group
    finally:
        group.leave()


class Joined:
    """A joined world: the collectives the run makes, each turned into E-DIST-004 when the
    other processes cannot be reached, so that no failure between them is an internal error."""

    def __init__(self, world: World, kind: str):
        import torch
        import torch.distributed as dist

        self.world, self.kind, self.torch, self.dist = world, kind, torch, dist
        self.first = world.rank == 0
        self.gpu = world.local_rank if kind == "cuda" else None
        self.device = torch.device("cuda", world.local_rank) if kind == "cuda" else torch.device("cpu")
        self.node_group = self.cross_group = None

    def join(self) -> None:
        """Meet the other processes (E-DIST-004 when they do not come within SEXPGPU_DIST_TIMEOUT)."""
        world = self.world
        if self.kind == "cuda":
            self.torch.cuda.set_device(self.device)  # before anything allocates: one GPU per process
        timeout = datetime.timedelta(seconds=settings.value("SEXPGPU_DIST_TIMEOUT") or DEFAULT_TIMEOUT)
        with self.failing("joining the other processes"):
            self.dist.init_process_group(world.backend, init_method=world.meeting, rank=world.rank,
                                         world_size=world.size, timeout=timeout)
        self.node_group, self.cross_group = self._subgroups()

    def _subgroups(self) -> tuple:
        """(this node's ranks, the ranks of this local rank on every node), in rank order.
        Every process makes every group, in the same order, as torch.distributed asks."""
        world, dist = self.world, self.dist
        if world.nodes == 1 or world.local_size == 1:
            return (None, None) if world.nodes == 1 else (_SELF, None)
        nodes = [[node * world.local_size + local for local in range(world.local_size)]
                 for node in range(world.nodes)]
        crosses = [[node * world.local_size + local for node in range(world.nodes)]
                   for local in range(world.local_size)]
        with self.failing("making the groups of nodes"):
            made = [dist.new_group(ranks) for ranks in nodes + crosses]
        return made[world.node], made[world.nodes + world.local_rank]

    @contextmanager
    def failing(self, doing: str):
        try:
            yield
        except (RuntimeError, ValueError) as error:  # torch.distributed's errors, DistError among them
            raise SexpgpuError("E-DIST-004", f"process {self.world.rank} of {self.world.size} failed {doing}: "
                                             f"{str(error).splitlines()[0][:300] if str(error) else type(error).__name__}.",
                               hint="Another process may have stopped (its own error says why), or cannot be "
                                    "reached; SEXPGPU_DIST_TIMEOUT sets how long a process waits.") from None

    def gather(self, tensor, group=None, doing: str = "gathering the gradients") -> list:
        """Every rank's `tensor` (one shape on all), in rank order; `_SELF` is this rank alone."""
        if group is _SELF:
            return [tensor]
        size = self.world.size if group is None else self.dist.get_world_size(group)
        parts = [self.torch.empty_like(tensor) for _ in range(size)]
        with self.failing(doing):
            self.dist.all_gather(parts, tensor.contiguous(), group=group)
        return parts

    def gather_bytes(self, payload: bytes, doing: str) -> list[bytes]:
        torch = self.torch
        sizes = self.gather(torch.tensor([len(payload)], dtype=torch.int64, device=self.device), doing=doing)
        longest = max(int(size) for size in sizes)
        data = torch.zeros(max(longest, 1), dtype=torch.uint8)
        data[:len(payload)] = torch.tensor(list(payload), dtype=torch.uint8)
        parts = self.gather(data.to(self.device), doing=doing)
        return [bytes(part[:int(size)].cpu().tolist()) for part, size in zip(parts, sizes)]

    def check_same(self, what: str, payload: bytes) -> None:
        """E-DIST-005 on every rank when the ranks were not started alike."""
        found = self.gather_bytes(hashlib.sha256(payload).digest(), f"comparing {what}")
        others = [rank for rank, digest in enumerate(found) if digest != found[0]]
        if others:
            raise SexpgpuError("E-DIST-005", f"the processes were not started alike: {what} of process(es) "
                                             f"{_listed(others)} differ from process 0's.",
                               hint="Start every process with the same file, selection, flags and SEXPGPU_* "
                                    "settings (SEXPGPU_NODE_GRADIENTS included), as torchrun does on one node.")

    def from_first(self, make, doing: str):
        """What rank 0 makes (a text), given to every rank."""
        made = make() if self.first else ""
        return self.gather_bytes(made.encode(), doing)[0].decode()

    @contextmanager
    def settled(self, doing: str):
        """Run the block; then every rank learns whether any failed with a coded error, and a
        rank that did not fail raises the first failure as its own (the same code)."""
        failure = None
        try:
            yield
        except SexpgpuError as error:
            failure = error
        statuses = self.gather_bytes(_status(failure), f"sharing the outcome of {doing}")
        if failure is not None:
            raise failure
        for rank, status in enumerate(statuses):
            if status:
                code, message = status.decode().split("\n", 1)
                raise SexpgpuError(code, f"process {rank} stopped while {doing}: {message}")

    def check_parameters(self, step: int, digest: str) -> None:
        """E-DIST-006 on every rank when the ranks' parameters are not the same bits after a step."""
        found = self.gather_bytes(bytes.fromhex(digest), f"comparing the parameters after step {step}")
        others = [rank for rank, theirs in enumerate(found) if theirs != found[0]]
        if others:
            raise SexpgpuError("E-DIST-006", f"after step {step} the parameters of process(es) {_listed(others)} are "
                                             "not the same bits as process 0's: every process applied the same "
                                             "update, so a process's memory or device corrupted them.",
                               hint="Resume from the last checkpoint; if it repeats on one machine, check that "
                                    "machine's memory and GPU.")

    def across(self, sums, node_gradients: str, exact: bool) -> "RankSums":
        """How a step's sums (the run's `Sums`) combine across these processes."""
        return RankSums(self, sums, node_gradients, exact)

    def leave(self) -> None:
        # after a failed exchange the group may not come apart cleanly; the process is ending
        # with that failure's error, which another from here would hide
        with suppress(RuntimeError, ValueError):
            if self.dist.is_initialized():
                self.dist.destroy_process_group()


_SELF = object()  # a group of this rank alone: gathering from it is the rank's own value


def _status(failure: SexpgpuError | None) -> bytes:
    return b"" if failure is None else f"{failure.code}\n{failure.message} {failure.hint or ''}".strip().encode()


def _listed(ranks) -> str:
    return ", ".join(str(rank) for rank in ranks)


# --- a step's sums across the ranks -----------------------------------------------------

class RankSums:
    """A step's sums across the ranks, after each rank summed its own microbatches with the
    run's `Sums` (run/loop.py): the same `add` combines the ranks' sums, in rank order within
    a node and in node order between nodes, so that a world's bits are a function of the
    configuration alone."""

    def __init__(self, group: Joined, sums, node_gradients: str, exact: bool):
        self.group, self.sums, self.node_gradients, self.exact = group, sums, node_gradients, exact
        self.share = group.world.share
        self.carried = None  # this node's bf16 rounding error, float32; not in a checkpoint

    def gradients(self, total: dict) -> dict:
        if self.exact:
            return self._exact(total)
        names = sorted(total)
        nodes_sum = self._fold(self.group.gather(_flat(total, names), self.group.node_group), total, names)
        if self.group.world.nodes == 1:
            return nodes_sum
        sent = _flat(nodes_sum, names)
        if self.node_gradients == "bf16":
            sent, self.carried = rounded_with_carry(sent, self.carried)
        return self._fold(self.group.gather(sent, self.group.cross_group, "sending gradients between nodes"),
                          total, names)

    def _fold(self, parts: list, like: dict, names: list) -> dict:
        folded = None
        for part in parts:
            folded = self.sums.add(folded, _unflat(part.float(), like, names))
        return folded

    def _exact(self, total: dict) -> dict:
        """Acc values (PendingSums or Accumulators), summed over every rank as integers: no order to fix."""
        from sexpgpu.backends.exact_sums import summed_over_processes

        summed = {}
        for name in sorted(total):  # every process reduces the same tensors in the same order
            with self.group.failing("summing the exact gradients"):
                summed[name] = summed_over_processes(total[name])
        return summed

    def losses(self, values: list) -> list:
        """Every rank's microbatch losses, in global microbatch order."""
        torch = self.group.torch
        mine = torch.tensor(np.asarray(values, dtype=np.float32)).to(self.group.device)
        parts = self.group.gather(mine, doing="gathering the losses")
        return [np.float32(value) for part in parts for value in part.cpu().numpy()]


def rounded_with_carry(gradient, carried):
    """(the bfloat16 a node sends, the float32 error it carries into its next step): the
    value sent is round(gradient + carried), to nearest even, and the carry what that
    rounding dropped, so that over the steps the rounding errors do not add up."""
    wanted = gradient if carried is None else gradient + carried
    sent = wanted.to(dtype=_bfloat16())
    return sent, wanted - sent.float()


def _bfloat16():
    import torch

    return torch.bfloat16


def _flat(values: dict, names: list):
    """The float32 values of `names`, one after another, as one tensor where they are."""
    import torch

    parts = [torch.from_numpy(np.ascontiguousarray(values[name], dtype=np.float32)) if isinstance(values[name], np.ndarray)
             else values[name].float() for name in names]
    return torch.cat([part.reshape(-1) for part in parts])


def _unflat(flat, like: dict, names: list) -> dict:
    """`flat` cut back into `like`'s shapes, in its storage: numpy arrays or device tensors."""
    values, start = {}, 0
    for name in names:
        shaped = like[name]
        stop = start + int(np.prod(shaped.shape, dtype=np.int64))
        piece = flat[start:stop].reshape(tuple(shaped.shape))
        values[name] = piece.cpu().numpy().astype(shaped.dtype, copy=False) if isinstance(shaped, np.ndarray) \
            else piece.to(shaped.dtype)
        start = stop
    return values
