"""What each rank runs in the distributed tests."""

from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist

from exact_random import wide_random
from sockets import listening_sockets
from sexpgpu.exact import DetLinear, det_all_reduce, det_finalize, det_gemm_partial

GEMM_SHAPE = (8, 6, 203)  # M, N, K
BATCH, IN, OUT, STEPS, LR = 18, 12, 5, 3, 0.1


def gemm_operands():
    generator = torch.Generator().manual_seed(21)
    m, n, k = GEMM_SHAPE
    return wide_random((m, k), torch.float32, generator), wide_random((n, k), torch.float32, generator)


def uneven_k_bounds(world: int) -> list[int]:
    """Shard boundaries of K for `world` ranks, deliberately unequal."""
    k = GEMM_SHAPE[2]
    weights = [rank + 1 for rank in range(world)]
    cuts = [k * sum(weights[: i + 1]) // sum(weights) for i in range(world)]
    return [0, *cuts]


def training_data():
    generator = torch.Generator().manual_seed(22)
    return torch.randn(BATCH, IN, generator=generator), torch.randn(BATCH, OUT, generator=generator)


def train_det_linear(rank: int, world: int, reduce_gradients: bool) -> torch.Tensor:
    """A few SGD steps on this rank's share of the batch; the loss is its share of the global mean."""
    torch.manual_seed(23)
    layer = DetLinear(IN, OUT, reduce_gradients=reduce_gradients)
    inputs, targets = training_data()
    x, t = torch.tensor_split(inputs, world)[rank], torch.tensor_split(targets, world)[rank]
    for _ in range(STEPS):
        layer.zero_grad()
        loss = (layer(x) - t).square().sum() / (BATCH * OUT)
        loss.backward()
        sgd_step(layer, LR)
    return torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()])


def sgd_step(module: torch.nn.Module, lr: float) -> None:
    # Plain SGD written out: torch.optim's first step imports more than these tests need.
    with torch.no_grad():
        for parameter in module.parameters():
            parameter -= lr * parameter.grad


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write per line: ranks share stdout


def join_world(rank: int, world: int, out_dir: str) -> None:
    """Join a gloo world that listens on the loopback interface only: the ranks meet through a
    file (torch's TCPStore would listen on every interface), and gloo binds to `lo`."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'store')}", rank=rank, world_size=world)


def record_listening(rank: int, world: int, out_dir: str) -> None:
    """Save what this rank listens on once its world is up."""
    join_world(rank, world, out_dir)
    try:
        dist.barrier()
        listening = [str(socket) for socket in listening_sockets() if not socket.loopback_only]
        torch.save({"listening": len(listening_sockets()), "exposed": listening}, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(rank: int, world: int, out_dir: str) -> None:
    join_world(rank, world, out_dir)
    try:
        x, w = gemm_operands()
        bounds = uneven_k_bounds(world)
        a, b = bounds[rank], bounds[rank + 1]
        y = det_finalize(det_all_reduce(det_gemm_partial(x[:, a:b], w[:, a:b])))
        say(f"rank {rank} of {world}: det_gemm digest {digest(y)}")
        weights = train_det_linear(rank, world, reduce_gradients=True)
        say(f"rank {rank} of {world}: DetLinear weights digest {digest(weights)}")
        torch.save({"y": y, "weights": weights}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
