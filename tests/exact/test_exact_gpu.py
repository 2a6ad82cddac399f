"""CUDA: the Triton kernel (and the sliced implementation on cuBLAS) against the CPU reference,
the oracle, and the composition guarantees. Skipped where no CUDA device is present."""

import functools

import pytest
import torch

from adversarial import KINDS
from exact_oracle import oracle_gemm, same_bits
from exact_random import random_cuts, random_fold, shard_partials, wide_random
from sockets import listening_sockets
from sexpgpu.exact import (
    DetLinear,
    implementations,
    det_all_reduce,
    det_combine,
    det_finalize,
    det_gemm,
    det_gemm_partial,
)
from sexpgpu.exact.layout import MAX_K_PER_CALL

pytestmark = pytest.mark.gpu

CUDA_IMPLEMENTATIONS = ["int8", "triton", "fp64", "sliced"]


def reference_digits(x, w):
    with implementations.forced("bins"):
        return det_gemm_partial(x.cpu(), w.cpu()).digits


@functools.lru_cache(maxsize=None)
def random_case(shape, spread, dtype):
    """Operands and their reference digits, computed once for all CUDA implementations."""
    m, n, k = shape
    generator = torch.Generator().manual_seed(m + n + k)
    x, w = wide_random((m, k), dtype, generator, spread), wide_random((n, k), dtype, generator, spread)
    return x, w, reference_digits(x, w)


def cuda_digits(name, x, w):
    with implementations.forced(name):
        return det_gemm_partial(x.cuda(), w.cuda()).digits.cpu()


def special_operands():
    x = torch.tensor([[2.0**-149, -(2.0**-149), 3.0e38, -0.0, 1.0, float("nan")],
                      [3.0e38, 3.0e38, 3.0e38, 1.0, -1.0, 0.5]])
    w = torch.tensor([[2.0**-149, 2.0**-149, 3.0e38, 5.0, 2.0**-24, 1.0],
                      [3.0e38, -3.0e38, 1.0, float("inf"), 1.0, 2.0**100]])
    return x, w


@pytest.mark.parametrize("name", CUDA_IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, spread", [((70, 45, 1000), 150), ((130, 129, 2000), 10), ((3, 2, 40000), 30)])
def test_cuda_digits_equal_the_cpu_reference(name, dtype, shape, spread):
    x, w, expected = random_case(shape, spread, dtype)
    assert torch.equal(cuda_digits(name, x, w), expected)


@pytest.mark.parametrize("name", CUDA_IMPLEMENTATIONS)
def test_cuda_special_values_and_extremes_equal_the_oracle(name):
    x, w = special_operands()
    with implementations.forced(name):
        assert same_bits(det_gemm(x.cuda(), w.cuda()).cpu(), oracle_gemm(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_results_equal_the_fraction_oracle(dtype):
    generator = torch.Generator().manual_seed(61)
    for _ in range(5):
        x, w = wide_random((4, 33), dtype, generator, 120), wide_random((3, 33), dtype, generator, 120)
        assert same_bits(det_gemm(x.cuda(), w.cuda()).cpu(), oracle_gemm(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("parts", [2, 4, 8, 16])
def test_cuda_k_shards_in_any_grouping_give_the_same_digits(dtype, parts):
    generator = torch.Generator().manual_seed(parts)
    x = wide_random((96, 1031), dtype, generator).cuda()
    w = wide_random((80, 1031), dtype, generator).cuda()
    whole = det_gemm_partial(x, w)
    partials = shard_partials(x, w, random_cuts(1031, parts, generator))
    assert torch.equal(det_combine(partials).digits, whole.digits)
    assert torch.equal(random_fold(partials, generator).digits, whole.digits)
    assert torch.equal(det_finalize(random_fold(partials, generator)), det_gemm(x, w))


@pytest.mark.parametrize("name", ["triton", "int8"])
def test_cuda_k_beyond_one_call(name):
    generator = torch.Generator().manual_seed(62)
    k = MAX_K_PER_CALL + 1000
    x, w = wide_random((2, k), torch.float32, generator, 20), wide_random((2, k), torch.float32, generator, 20)
    assert torch.equal(cuda_digits(name, x, w), reference_digits(x, w))


def test_int8_tensor_cores_are_the_default_from_compute_capability_8():
    expected = "int8" if torch.cuda.get_device_capability() >= (8, 0) else "triton"
    assert implementations.select(torch.device("cuda")).name == expected


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_on_adversarial_data_equals_the_oracle(kind, dtype):
    generator = torch.Generator().manual_seed(len(kind) + 7)
    x, w = KINDS[kind](20, 9, 301, dtype, generator)  # odd shapes: _int_mm's padding
    with implementations.forced("int8"):
        assert same_bits(det_gemm(x.cuda(), w.cuda()).cpu(), oracle_gemm(x, w))


def test_det_linear_on_cuda_gives_the_cpu_bits():
    generator = torch.Generator().manual_seed(63)
    x, grad_y = torch.randn(64, 96, generator=generator), torch.randn(64, 48, generator=generator)
    weight, bias = torch.randn(48, 96, generator=generator), torch.randn(48, generator=generator)
    results = []
    for device in ("cpu", "cuda"):
        layer = DetLinear(96, 48, device=device, k_shards=[10, 50])
        with torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        xd = x.to(device).clone().requires_grad_(True)  # a fresh leaf on each device
        y = layer(xd)
        y.backward(grad_y.to(device))
        results.append([t.detach().cpu() for t in (y, xd.grad, layer.weight.grad, layer.bias.grad)])
    for on_cpu, on_cuda in zip(*results):
        assert torch.equal(on_cpu, on_cuda)


def test_det_all_reduce_through_nccl_at_world_size_one(tmp_path, monkeypatch):
    # One GPU here: NCCL's int64 all-reduce path at world size 1 (more GPUs were not available).
    # The rank meets its world through a file, not a TCPStore (which would listen on every
    # interface), and NCCL's own sockets use the loopback interface.
    import torch.distributed as dist

    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        generator = torch.Generator().manual_seed(64)
        x, w = wide_random((32, 500), torch.float32, generator).cuda(), wide_random((16, 500), torch.float32, generator).cuda()
        acc = det_all_reduce(det_gemm_partial(x, w))
        assert torch.equal(det_finalize(acc), det_gemm(x, w))
        assert [str(s) for s in listening_sockets() if not s.loopback_only] == []
    finally:
        dist.destroy_process_group()
