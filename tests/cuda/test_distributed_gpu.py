"""Runs on several processes (docs/distributed.md) on a GPU machine, with NCCL and one process:
the most one GPU can show. Skipped where no GPU is present.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_distributed_gpu.py -m gpu -n 0 -v

- det_all_reduce of exact accumulators through NCCL with one process gives the bits of gloo
  with one process and of no process group at all;
- a joined world of one process on CUDA (distributed/world.py over NCCL) gives back what it gathers:
  bytes (the digests' exchange), losses, float gradients in their CUDA storage (float32 and
  bfloat16), and exact accumulators summed over its one process;
- tiny-adam through torchrun, one process on CUDA (NCCL), writes the bits of the same run
  without torchrun: metrics.jsonl and the final checkpoint's tensors, byte for byte.

Every process group meets through a file, and NCCL's sockets use the loopback interface;
torchrun's own store is torchrun's (tests/architecture/test_loopback_only.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sexpgpu.exact import Accumulator, det_all_reduce, det_finalize, det_gemm_partial  # noqa: E402
from sexpgpu.run.loop import FLOAT_SUMS  # noqa: E402
from sockets import in_loopback_namespace  # noqa: E402
from sexpgpu.distributed.world import World, joined  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

ROOT = Path(__file__).resolve().parents[2]


def wide_operands():
    """A product's operands whose exponents spread wide, so that the exact sum has digits far apart."""
    generator = torch.Generator().manual_seed(16)
    x = torch.randn(24, 300, generator=generator) * torch.exp2(torch.randint(-30, 30, (24, 300), generator=generator))
    w = torch.randn(8, 300, generator=generator) * torch.exp2(torch.randint(-30, 30, (8, 300), generator=generator))
    return x, w


def reduced_through(backend: str, digits: torch.Tensor, store: Path) -> torch.Tensor:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    try:
        return det_all_reduce(Accumulator(digits.clone())).digits.cpu()
    finally:
        dist.destroy_process_group()


def test_det_all_reduce_over_nccl_gives_the_bits_of_gloo_and_of_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    x, w = wide_operands()
    alone = det_gemm_partial(x, w)
    over_nccl = reduced_through("nccl", det_gemm_partial(x.cuda(), w.cuda()).digits, tmp_path / "nccl")
    over_gloo = reduced_through("gloo", alone.digits, tmp_path / "gloo")
    assert torch.equal(over_nccl, alone.digits) and torch.equal(over_gloo, alone.digits)
    rounded = det_finalize(alone)
    assert torch.equal(det_finalize(Accumulator(over_nccl)).view(torch.int32), rounded.view(torch.int32))


def test_a_joined_world_of_one_gpu_gives_back_what_it_exchanges(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    world = World(meeting=f"file://{tmp_path / 'store'}")
    with joined(world, "cuda") as group:
        assert group.gather_bytes(b"digest", "testing") == [b"digest"]
        group.check_parameters(1, "ab" * 32)
        across = group.across(FLOAT_SUMS, "bf16", exact=False)
        generator = torch.Generator().manual_seed(3)
        grads = {"grad/a": torch.randn(3, 4, generator=generator).cuda(),
                 "grad/b": torch.randn(5, generator=generator).to(torch.bfloat16).cuda()}
        combined = across.gradients(grads)
        for name, value in grads.items():
            assert combined[name].device == value.device and combined[name].dtype == value.dtype
            assert torch.equal(combined[name], value), name
        assert across.losses([np.float32(1.5), np.float32(-2.25)]) == [np.float32(1.5), np.float32(-2.25)]
        x, w = wide_operands()
        partial = det_gemm_partial(x.cuda(), w.cuda())
        wanted = det_finalize(partial).cpu()
        exact = group.across(None, "bf16", exact=True).gradients({"grad/w": partial})
        assert torch.equal(det_finalize(exact["grad/w"]).cpu().view(torch.int32), wanted.view(torch.int32))


def short_tiny(folder: Path) -> Path:
    text = (ROOT / "src/sexpgpu/ladder/reference/tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{ROOT}/examples/data/spirals.npz"')
    text = text.replace(":steps 200", ":steps 6").replace(":checkpoint 100", ":checkpoint 3").replace(":every 50", ":every 3")
    path = folder / "tiny-adam.sexp"
    path.write_text(text)
    return path


def test_torchrun_with_one_process_on_cuda_gives_the_bits_of_a_run_without_it(tmp_path):
    file = short_tiny(tmp_path)
    environment = dict(os.environ, NCCL_SOCKET_IFNAME="lo", PYTHONPATH=str(ROOT / "src"), HOME=str(tmp_path))
    run = ["-m", "sexpgpu", "run", str(file), "--device", "cuda", "--deterministic", "--run-dir"]
    plain = subprocess.run([sys.executable, *run, str(tmp_path / "plain")], env=environment, capture_output=True,
                           text=True, timeout=900)
    assert plain.returncode == 0, plain.stderr[-3000:]
    command = in_loopback_namespace([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     "--nproc-per-node", "1", *run, str(tmp_path / "torchrun")])
    if command is None:
        pytest.skip("no network namespace of loopback alone can be made here, and torchrun's store would "
                    "listen on every interface")
    launched = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert (tmp_path / "torchrun/metrics.jsonl").read_bytes() == (tmp_path / "plain/metrics.jsonl").read_bytes()
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert (tmp_path / "torchrun/step-6" / name).read_bytes() == (tmp_path / "plain/step-6" / name).read_bytes()
