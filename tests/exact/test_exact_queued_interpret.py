"""The queued path (queued.py, queued_kernels.py): the CUDA paths of det_gemm(non_blocking=True),
det_gemm_batched and det_sum, run on CPU tensors by Triton's interpreter (implementations.device_paths).

Every output has the Fraction oracle's bits, through each stage on its own (the float64 bound,
the pair sums, the exact digits rounded in the kernel) and together, on random and
adversarial data, with NaN and infinities, ties, long rows cut into segments, digit registers
flushed, strided operands and empty shapes; a list that must hold every output; and no call
reads anything back from the device (bench/exact_counts.py counts the syncs).
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
if torch.cuda.is_available():  # pragma: no cover - the kernels are then compiled, and tests/exact's GPU tests run them
    pytest.skip("a GPU is present: the queued kernels run compiled there", allow_module_level=True)

from adversarial import KINDS  # noqa: E402
from exact_oracle import BFLOAT16, BINARY32, oracle_gemm, same_bits  # noqa: E402
from sexpgpu.exact import det_gemm, det_gemm_batched, det_sum, queued
from sexpgpu.exact import implementations  # noqa: E402
from sexpgpu.exact.float64_stage import SLACK, UNIT, gamma, upward_float32, widened  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from exact_counts import counting  # noqa: E402

FORMATS = {torch.float32: BINARY32, torch.bfloat16: BFLOAT16}


pytestmark = pytest.mark.usefixtures("interpreted_device_paths")


def kernels():
    from sexpgpu.exact import queued_kernels  # decorated under the interpreter: imported in a test

    return queued_kernels


def oracle(x, w) -> torch.Tensor:
    return oracle_gemm(x.float(), w.float(), BINARY32)


def sums_oracle(rows) -> torch.Tensor:
    return oracle(rows, torch.ones((1, rows.shape[1]))).reshape(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_products_sums_and_batches_have_the_exact_rounding(kind, dtype):
    generator = torch.Generator().manual_seed(len(kind))
    x, w = KINDS[kind](5, 6, 37, dtype, generator)
    assert same_bits(det_gemm(x, w, non_blocking=True), oracle(x, w))
    assert same_bits(det_sum(x, 1, dtype=torch.float32), sums_oracle(x))
    xs, ws = torch.stack([x, x.flip(0)]), torch.stack([w, -w])
    found = det_gemm_batched(xs, ws)
    assert same_bits(found, torch.stack([oracle(xs[b], ws[b]) for b in range(2)]))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_host_path_on_the_device_paths_accounts_for_every_output(kind):
    """det_gemm (blocking) on the paths a GPU takes: the oracle's bits, and its statistics
    account for every output (float64 product, pair sums, tiers, exact accumulator)."""
    from sexpgpu.exact import bounded_gemm

    generator = torch.Generator().manual_seed(3 + len(kind))
    x, w = KINDS[kind](9, 7, 300, torch.float32, generator)
    assert same_bits(det_gemm(x, w), oracle(x, w))
    stats = bounded_gemm.last_statistics
    settled = stats.first_settled + stats.pairs_settled + sum(stats.settled_after)
    assert settled + stats.fallback == stats.outputs == 63


def test_the_host_path_takes_the_tiers_when_the_count_is_large(monkeypatch):
    from sexpgpu.exact import bounded_gemm

    # the threshold lowered, so that a small shape (fast under the interpreter) crosses it
    monkeypatch.setattr(bounded_gemm, "PAIR_MINIMUM", 64)
    x, w = KINDS["whole range in a row"](24, 20, 40, torch.float32, torch.Generator().manual_seed(5))
    assert same_bits(det_gemm(x, w), oracle(x, w))
    stats = bounded_gemm.last_statistics
    assert stats.tiers > 0 and stats.pairs == 0 and stats.first_settled < 24 * 20 - bounded_gemm.PAIR_MINIMUM


def test_nan_and_infinities_take_the_special_rule():
    generator = torch.Generator().manual_seed(4)
    x, w = torch.randn((4, 9), generator=generator), torch.randn((6, 9), generator=generator)
    x[1, 3], x[3, 2], w[2, 0], w[4, 2], w[5, 7] = float("inf"), float("-inf"), float("nan"), 0.0, float("inf")
    want = det_gemm(x.clone(), w.clone())  # the host path (it counts special products apart)
    with implementations.forced("bins"):
        assert same_bits(want, det_gemm(x, w))
    assert same_bits(det_gemm(x, w, non_blocking=True), want)
    assert same_bits(det_sum(x, 1), torch.stack([det_sum(row[None], 1)[0] for row in x]))
    assert same_bits(det_gemm_batched(x[None], w[None])[0], want)


def test_ties_and_cancellation_reach_the_exact_digits():
    # 1 + 2**-24 is a tie in float32 (to 1); x . w cancels to far below its terms
    x = torch.tensor([[1.0, 2.0**-24, 2.0**-24, -1.0, 2.0**-30], [1.0, 2.0**-24, 0.0, 0.0, 0.0],
                      [3e38, 3e38, -3e38, -3e38, 2.0**-140]])
    w = torch.ones((3, 5))
    assert same_bits(det_gemm(x, w, non_blocking=True), oracle(x, w))
    assert same_bits(det_sum(x, 1), sums_oracle(x))


def every_output_exactly(x, w, flush: int, lanes: int = 4) -> torch.Tensor:
    """_exact_refine alone, on a list of every output, in `lanes` lanes along K, its digit
    registers flushed every `flush` columns."""
    m, n, k = x.shape[0], w.shape[0], x.shape[1]
    result = torch.full((m * n,), 7.0)
    listed, count = torch.arange(m * n), torch.tensor([m * n])
    kernels()._exact_refine[(3,)](x, w, listed, count, result, m, n, k, x.stride(0), x.stride(1),
                                  w.stride(0), w.stride(1), ONES=False, BLOCK_P=8, BLOCK_K=lanes, FLUSH=flush)
    return result.view(m, n)


ROUNDINGS = [  # (x, w) of one output each: ties to even, subnormals, signed zeros, overflow
    ([1.0, 2.0**-24], [1.0, 1.0]), ([1.0, 3 * 2.0**-24], [1.0, 1.0]), ([1.0, 2.0**-24, 2.0**-24], [1.0, 1.0, 1.0]),
    ([3e38, 3e38], [3e38, 3e38]), ([-3e38, -3e38], [3e38, 3e38]), ([2.0**-149, 2.0**-149], [0.5, 0.25]),
    ([-(2.0**-149)], [0.25]), ([-(2.0**-149)], [0.75]), ([2.0**-149], [0.5]), ([1.0, -1.0], [1.0, 1.0]),
    ([3.4028234663852886e38, 3.4028234663852886e38 * 2.0**-24], [1.0, 1.0]),
    ([3.4028234663852886e38, 3.4028234663852886e38 * 2.0**-25], [1.0, 1.0]),
    ([2.0**100, -(2.0**-100)], [2.0**27, 1.0]), ([-(2.0**-126), 2.0**-150 * 3], [1.0, 1.0]), ([0.0], [-1.0]),
]


@pytest.mark.parametrize("x_row, w_row", ROUNDINGS)
def test_the_kernels_rounding_of_digits_is_the_exact_rounding(x_row, w_row):
    x, w = torch.tensor([x_row]), torch.tensor([w_row])
    assert same_bits(every_output_exactly(x, w, flush=1), oracle(x, w))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_exact_stage_alone_gives_every_output_with_registers_flushed(kind):
    generator = torch.Generator().manual_seed(7)
    x, w = KINDS[kind](4, 5, 23, torch.float32, generator)
    assert same_bits(every_output_exactly(x, w, flush=5), oracle(x, w))
    assert same_bits(every_output_exactly(x, w, flush=64, lanes=16), oracle(x, w))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_long_k_takes_the_long_refine_shape_with_the_same_rounding(kind, monkeypatch):
    """From LONG_K on, the pair refine takes few outputs in many lanes: here from K = 16."""
    monkeypatch.setattr(queued, "LONG_K", 16)
    assert queued.refine_shape(40) == queued.LONG_SHAPE
    generator = torch.Generator().manual_seed(11)
    x, w = KINDS[kind](5, 6, 40, torch.float32, generator)
    assert same_bits(det_gemm(x, w, non_blocking=True), oracle(x, w))
    assert same_bits(det_sum(x, 1), sums_oracle(x))


def test_the_pair_stage_alone_settles_only_correct_outputs():
    """With nothing settled by the float64 product, the pair sums settle randn's outputs, each
    to its exact rounding, and put the rest on the second list, each once."""
    generator = torch.Generator().manual_seed(9)
    for kind in sorted(KINDS):
        x, w = KINDS[kind](4, 5, 40, torch.float32, generator)
        m, n, k = x.shape[0], w.shape[0], x.shape[1]
        result, done = torch.zeros(m * n), torch.zeros(m * n, dtype=torch.int8)
        x_norm, w_norm = widened(x)[1], widened(w)[1]
        terms = queued.pair_terms(k)
        listed, count = queued._pending_list(done)
        assert int(count) == m * n
        left, left_count = torch.full((m * n,), -1), torch.zeros(1, dtype=torch.int64)
        kernels()._pair_refine[(2,)](x, w, x_norm, w_norm, listed, count, result, done, left, left_count, m, n, k,
                                     x.stride(0), x.stride(1), w.stride(0), w.stride(1), upward_float32(UNIT * SLACK),
                                     upward_float32(gamma(terms) * terms * UNIT * SLACK), ONES=False, BLOCK_P=8,
                                     BLOCK_K=queued.LANES)
        settled = done.bool()
        assert same_bits(result[settled], oracle(x, w).reshape(-1)[settled]), kind
        assert sorted(left[:int(left_count)].tolist()) == (~settled).nonzero()[:, 0].tolist(), kind
        if kind == "randn":
            assert bool(settled.all())


def test_long_rows_are_cut_into_segments_with_the_same_rounding(monkeypatch):
    monkeypatch.setattr(queued, "SEGMENT", 32)
    generator = torch.Generator().manual_seed(2)
    rows = KINDS["cancellation"](3, 1, 150, torch.float32, generator)[0]
    rows[1] = torch.randn(rows.shape[1], generator=generator) ** 2
    assert same_bits(queued.queued_sum(rows), sums_oracle(rows))


def test_strided_operands_and_sums_over_the_first_axis():
    generator = torch.Generator().manual_seed(5)
    x, w = torch.randn((6, 5), generator=generator), torch.randn((5, 7), generator=generator)
    assert same_bits(det_gemm(x, w.T, non_blocking=True), oracle(x, w.T))
    assert same_bits(det_sum(x, 0), sums_oracle(x.T))
    wide = torch.randn((3, 40, 8), generator=generator)[:, ::3, :]  # rows of a batch sum, strided
    assert same_bits(det_sum(wide.reshape(3, -1), 1), sums_oracle(wide.reshape(3, -1)))


def test_batches_of_transposed_and_broadcast_matrices_are_read_as_they_lie(monkeypatch):
    """An attention's P.T @ dO: x a batch of transposed matrices, w one matrix broadcast over the
    batch (stride 0). The widening reads both strides as they are (no copy is made first) and
    every matrix has the exact rounding."""
    generator = torch.Generator().manual_seed(8)
    p = torch.rand((3, 9, 20), generator=generator)
    x = p.transpose(1, 2)  # (3, 20, 9): rows a column of p apart, matrices p's apart
    w = torch.randn((5, 9), generator=generator).expand(3, 5, 9)
    copies, contiguous = [], torch.Tensor.contiguous

    def copied(t, *args, **kwargs):
        if not t.is_contiguous():
            copies.append(tuple(t.shape))
        return contiguous(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "contiguous", copied)
    found = det_gemm_batched(x, w)
    assert not copies
    assert same_bits(found, torch.stack([oracle(x[b], w[b]) for b in range(3)]))
    wide, norm = widened(x)
    assert torch.equal(wide, x.reshape(60, 9).double()) and norm.shape == (60,)


def test_empty_shapes():
    assert det_gemm(torch.zeros((0, 4)), torch.zeros((3, 4)), non_blocking=True).shape == (0, 3)
    assert same_bits(det_gemm(torch.ones((2, 0)), torch.ones((3, 0)), non_blocking=True), torch.zeros((2, 3)))
    assert same_bits(det_sum(torch.ones((3, 0)), 1), torch.zeros(3))
    assert det_gemm_batched(torch.zeros((0, 2, 3)), torch.zeros((0, 4, 3))).shape == (0, 2, 4)


def test_the_list_holds_every_output_when_none_settles():
    """A NaN in every row of w leaves every output to the pair stage: the list holds them all,
    and every output is NaN, as the host path says."""
    generator = torch.Generator().manual_seed(6)
    x, w = torch.randn((5, 8), generator=generator), torch.randn((7, 8), generator=generator)
    w[:, 3] = float("nan")
    found = det_gemm(x, w, non_blocking=True)
    assert bool(torch.isnan(found).all()) and same_bits(found, det_gemm(x, w))


def test_no_call_reads_the_device_back():
    generator = torch.Generator().manual_seed(8)
    x, w = torch.randn((6, 40), generator=generator), torch.randn((5, 40), generator=generator)
    x[0, 0] = float("inf")
    ties = torch.tensor([[1.0, 2.0**-24], [1.0, 1.0]])
    det_gemm(x, w, non_blocking=True)  # the kernels are loaded before counting
    with counting() as counts, counts.phase("calls"):
        det_gemm(x, w, non_blocking=True)
        det_gemm_batched(torch.stack([x, x]), torch.stack([w, w]))
        det_sum(x, 1)
        det_sum(ties, 1)
        det_sum(torch.randn(300, generator=generator), 0)
    assert counts.tallies["calls"].sync_count == 0, counts.tallies["calls"].syncs


def host_planes(kind: str, seed: int) -> torch.Tensor:
    """The digits of an adversarial product, formed on the host path."""
    from sexpgpu.exact import det_gemm_partial

    generator = torch.Generator().manual_seed(seed)
    x, w = KINDS[kind](6, 5, 29, torch.float32, generator)
    with implementations.device_paths(False):
        return det_gemm_partial(x, w).digits


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_accumulators_carry_and_round_on_the_device_as_on_the_host(kind):
    """normalise_ and round_planes in one kernel each: the host's digits and values, for sums of
    accumulators (uncarried, negated, with special counts above 1)."""
    from sexpgpu.exact.accumulator import normalise_
    from sexpgpu.exact.layout import NAN_PLANE, POS_INF_PLANE
    from sexpgpu.exact.rounding import round_planes

    planes = host_planes(kind, 1) * 3 - host_planes(kind, 2)  # uncarried digits, either sign
    planes[NAN_PLANE:] = 0
    planes[NAN_PLANE, 0, 1], planes[POS_INF_PLANE, 2, 3], planes[POS_INF_PLANE + 1, 2, 3] = 4, 2, 1
    planes[POS_INF_PLANE, 4, 4] = 3
    host = planes.clone()
    with implementations.device_paths(False):  # the host's own carrying and rounding
        normalise_(host)
        want = round_planes(host, torch.float32)
    found = normalise_(planes.clone())
    assert torch.equal(found, host)
    assert same_bits(round_planes(planes, torch.float32), want)  # uncarried planes round alike
    assert same_bits(round_planes(found, torch.float32), want)


SCATTERS = {  # ids (two axes, as an embedding's tokens) for 6 rows
    "repeated": torch.tensor([[0, 5, 2, 5], [2, 2, 0, 4]]),
    "one id": torch.full((2, 5), 3),
    "none": torch.zeros((0, 4), dtype=torch.int64),
}


@pytest.mark.parametrize("name", sorted(SCATTERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scatter_sums_on_the_device_are_the_hosts(name, dtype, monkeypatch):
    """det_scatter_sum(_partial) in one kernel: the host path's digits and rounding, for repeated
    ids, one id for every position (its registers flushed every 3 rows), NaN and infinities."""
    from sexpgpu.exact import det_scatter_sum, det_scatter_sum_partial, scatter

    monkeypatch.setattr(scatter, "MAX_K_PER_CALL", 3)
    ids = SCATTERS[name]
    generator = torch.Generator().manual_seed(ids.numel())
    values = KINDS["whole range in a row"](ids.numel(), 1, 3, torch.float32, generator)[0].to(dtype)
    values = values.reshape(*ids.shape, 3)
    if ids.numel():
        values[0, 1, 2], values[1, 0, 0], values[1, 1, 0] = float("nan"), float("inf"), float("-inf")
    with implementations.device_paths(False):
        want = det_scatter_sum_partial(ids, values, 6)
        rounded = det_scatter_sum(ids, values, 6)
    assert torch.equal(det_scatter_sum_partial(ids, values, 6).digits, want.digits)
    assert same_bits(det_scatter_sum(ids, values, 6), rounded)


def test_the_hosts_scatter_refuses_an_id_out_of_range():
    from sexpgpu.exact import det_scatter_sum

    with implementations.device_paths(False), pytest.raises(ValueError, match="outside 0..2"):
        det_scatter_sum(torch.tensor([0, 3]), torch.ones((2, 4)), 3)


@pytest.mark.parametrize("layout", ["rows", "transposed"])
def test_widening_keeps_every_value_and_bounds_each_norm_across_segments(layout):
    """Three rows of 1000 columns take several segments of K (few rows, so the programs are
    spread along K): the float64 copy is the operand's values exactly, non-finite ones kept, and
    each norm bound is at least the exact norm, infinite or NaN where the row holds one."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, 1000, generator=generator) * 2.0 ** torch.randint(-60, 60, (3, 1000), generator=generator)
    x[1, 517], x[2, 3] = float("inf"), float("nan")
    operand = x if layout == "rows" else x.T.contiguous().T  # the same values, a column apart
    k, block_k = 1000, 128 if layout == "rows" else 32
    assert -(-k // block_k) > 1  # more than one step of K, so more than one segment
    wide, norm = widened(operand)
    assert wide.is_contiguous() and torch.equal(wide.view(torch.int64)[0], x.double().view(torch.int64)[0])
    assert torch.equal(wide[1], x[1].double()) and bool(torch.isnan(wide[2, 3]))
    exact_square = sum(Fraction(v) ** 2 for v in x[0].double().tolist())
    assert Fraction(float(norm[0])) ** 2 >= exact_square
    assert norm[1] == float("inf") and bool(torch.isnan(norm[2]))
