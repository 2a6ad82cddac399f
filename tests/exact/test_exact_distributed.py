"""det_all_reduce over gloo: K-sharded GEMMs and data-parallel DetLinear at world sizes 1, 2, 4."""

import re
import time

import pytest
import torch
import torch.multiprocessing as mp

import exact_dist_worker as worker
from sexpgpu.exact import det_gemm


def run_world(world: int, out_dir, timeout_s: float = 240.0, job=worker.run) -> list[dict]:
    context = mp.start_processes(job, args=(world, str(out_dir)), nprocs=world, join=False, start_method="fork")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"world size {world} did not finish within {timeout_s} s")
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in range(world)]


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_gemm_and_data_parallel_det_linear_match_one_process(world, tmp_path, capfd):
    results = run_world(world, tmp_path)
    x, w = worker.gemm_operands()
    single_y = det_gemm(x, w)
    single_weights = worker.train_det_linear(rank=0, world=1, reduce_gradients=False)
    for result in results:
        assert torch.equal(result["y"], single_y)
        assert torch.equal(result["weights"], single_weights)
    printed = capfd.readouterr().out
    for what, value in [("det_gemm", single_y), ("DetLinear weights", single_weights)]:
        said = re.findall(rf"rank (\d+) of {world}: {what} digest ([0-9a-f]+)", printed)
        assert sorted(int(rank) for rank, _ in said) == list(range(world))
        assert {digest for _, digest in said} == {worker.digest(value)}


def test_a_world_listens_on_the_loopback_interface_only(tmp_path):
    results = run_world(2, tmp_path, job=worker.record_listening)
    assert all(result["listening"] > 0 for result in results)  # gloo's own connections
    assert [result["exposed"] for result in results] == [[], []]


def test_float32_data_parallel_training_is_not_this_exact():
    # Without exact reduction, the same split of the batch moves the weights' bits.
    inputs, targets = worker.training_data()

    def train(parts):
        torch.manual_seed(23)
        layer = torch.nn.Linear(worker.IN, worker.OUT)
        for _ in range(worker.STEPS):
            grads = []
            for x, t in zip(torch.tensor_split(inputs, parts), torch.tensor_split(targets, parts)):
                layer.zero_grad()
                ((layer(x) - t).square().sum() / (worker.BATCH * worker.OUT)).backward()
                grads.append([p.grad.clone() for p in layer.parameters()])
            for p, *gs in zip(layer.parameters(), *grads):
                p.grad = sum(gs)
            worker.sgd_step(layer, worker.LR)
        return torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach()])

    assert not torch.equal(train(1), train(4))
