"""The residue stage (residue_stage.py, residue_kernel.py): det_gemm's first stage on int8
tensor cores, run on CPU tensors by Triton's interpreter.

Each part is held to an oracle of its own: the residue planes to Python integers, the rows'
bounds to Fractions, the moduli's constants to the Chinese remainder theorem, the products
modulo each modulus to int64 matrix products, and every
output the stage settles (and det_gemm's result through it) to the Fraction oracle, on
random and adversarial data, ties, zeros, subnormals, strided operands and row panels.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

pytest.importorskip("triton")
if torch.cuda.is_available():  # pragma: no cover - compiled there; tests/exact's GPU tests run the stage
    pytest.skip("a GPU is present: the residue kernels run compiled there", allow_module_level=True)

from adversarial import KINDS  # noqa: E402
from exact_oracle import BINARY32, oracle_gemm, same_bits  # noqa: E402
from sexpgpu.exact import det_gemm, residue_stage
from sexpgpu.exact import implementations
from sexpgpu.exact import bounded_gemm  # noqa: E402
from sexpgpu.exact.residue_stage import MAX_K, MODULI, Moduli, residue_product, residues  # noqa: E402


pytestmark = pytest.mark.usefixtures("interpreted_device_paths")
SHORTEST, FEWEST = residue_stage.MIN_K, residue_stage.MIN_ROWS  # below them, the float64 product is faster


@pytest.fixture(autouse=True)
def residues_at_every_shape(monkeypatch):
    """The stage at the tests' small shapes, which it takes only from MIN_K and MIN_ROWS on by default."""
    monkeypatch.setattr(residue_stage, "MIN_K", 1)
    monkeypatch.setattr(residue_stage, "MIN_ROWS", 1)


def test_the_moduli_are_coprime_and_bound_the_products():
    assert all(math.gcd(a, b) == 1 for i, a in enumerate(MODULI) for b in MODULI[i + 1:])
    for count in range(2, len(MODULI) + 1):
        moduli = Moduli.first(count)
        assert 2 ** (2 * moduli.top) <= moduli.product // 4  # |A| <= 2**(2c) <= P / 4
        assert moduli.product < 2 ** (32 * moduli.words) and moduli.words <= 4
    assert MAX_K * 128 * 128 < 2**31  # int32 sums of residue products cannot overflow


def test_the_table_rebuilds_integers_by_the_chinese_remainder_theorem():
    moduli = Moduli.first(12)
    table, words = moduli.table(torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    for _ in range(200):
        value = int(torch.randint(-(2**62), 2**62, (1,), generator=generator)) * 2**29 // 3
        residues_of = [value % m for m in MODULI[:12]]
        total = sum(y * sum(int(table[i, 3 + j]) << (32 * j) for j in range(4)) for i, y in enumerate(residues_of))
        quotient = round(sum(y * float(table[i, 2]) for i, y in enumerate(residues_of)))
        assert total - quotient * sum(int(words[j]) << (32 * j) for j in range(4)) == value


def row_cases(generator):
    yield "randn", torch.randn((13, 70), generator=generator)
    yield "spread", torch.randn((9, 40), generator=generator) * torch.exp2(torch.randint(-90, 90, (9, 40), generator=generator).float())
    yield "zero row", torch.cat([torch.zeros((1, 33)), torch.randn((2, 33), generator=generator)])
    yield "subnormals", torch.randint(1, 1 << 23, (5, 30), generator=generator).float() * 2.0**-149
    yield "huge", torch.full((3, 20), 3.0e38)
    yield "bf16", torch.randn((11, 50), generator=generator).bfloat16()


@pytest.mark.parametrize("count", [10, 12])
def test_residues_bounds_and_scales_are_what_they_claim(count):
    moduli = Moduli.first(count)
    for name, rows in row_cases(torch.Generator().manual_seed(2)):
        r, k = rows.shape
        found = residues(rows, moduli, 128, 128)
        for i in range(r):
            values = [Fraction(v) for v in rows[i].double().tolist()]
            norm = sum(v * v for v in values)
            assert Fraction(found.norm[i].item()) ** 2 >= norm, name
            unscale = Fraction(found.unscale[i].item())
            assert unscale.numerator == 1 or unscale.denominator == 1  # a power of two
            scaled = [v / unscale for v in values]
            integers = [round(v) for v in scaled]  # ties to even, as the kernel's rint
            assert sum(v * v for v in scaled) < Fraction(2) ** (2 * (moduli.top - 1)), name
            cut = sum((v - q) ** 2 for v, q in zip(scaled, integers)) * unscale**2
            assert Fraction(found.residual[i].item()) ** 2 >= cut, name
            assert (found.residual[i].item() == 0) == (cut == 0), name
            for t, m in enumerate(MODULI[:count]):
                plane = found.planes[t, i].tolist()
                assert all((p - q) % m == 0 for p, q in zip(plane, integers)), (name, m)
                assert all(p == 0 for p in plane[k:]), name  # padding columns
        assert not found.planes[:, r:].any()  # padding rows


def test_the_products_are_the_planes_products_modulo_each_modulus():
    from sexpgpu.exact.residue_stage import LARGE, _products

    moduli = Moduli.first(12)
    generator = torch.Generator().manual_seed(8)
    x, w = torch.randn((130, 200), generator=generator), torch.randn((20, 200), generator=generator) * 1e6
    xs, ws = residues(x, moduli, LARGE.block_m, LARGE.block_k), residues(w, moduli, LARGE.block_n, LARGE.block_k)
    products = _products(xs, ws, 128, 128, moduli, LARGE)  # the second row panel, with the GPU's tile
    for i, m in enumerate(MODULI[:12]):
        want = xs.planes[i, 128:256].long() @ ws.planes[i].long().T
        got = products[i].long()
        assert bool(((got - want) % m == 0).all()) and -128 <= int(got.min()) and int(got.max()) <= 127


def stage_cases(generator):
    for kind in sorted(KINDS):
        for dtype in (torch.float32, torch.bfloat16):
            yield kind, dtype, *KINDS[kind](17, 19, 90, dtype, generator)
    x = torch.tensor([[1.0, 2.0**-24], [1.0, 3 * 2.0**-25], [2.0**-30, -2.0**-30]])
    yield "ties", torch.float32, x, torch.ones((20, 2))
    yield "exact zeros", torch.float32, torch.zeros((18, 5)), torch.randn((20, 5), generator=generator)
    # 1 + 2**-24 + 2**-63: just above a tie, on both rows' grids, but A spans 63 bits, so its
    # float64 sum rounds to the tie: only the sum's own error keeps it from settling as 1
    yield "above a tie", torch.float32, torch.tensor([[1.0, 2.0**-24, 2.0**-43]] * 17), \
        torch.tensor([[1.0, 1.0, 2.0**-20]] * 18)


def test_every_settled_output_is_the_exact_sums_rounding():
    for kind, dtype, x, w in stage_cases(torch.Generator().manual_seed(3)):
        x, w = (torch.where(torch.isfinite(t), t, torch.zeros((), dtype=t.dtype)) for t in (x, w))
        settled = residue_product(x, w)
        want = oracle_gemm(x, w, BINARY32)
        assert same_bits(settled.result[settled.done], want[settled.done]), (kind, dtype)
        assert not settled.result[~settled.done].any()
        if kind in ("randn", "ties", "exact zeros"):
            assert bool(settled.done.all()), (kind, dtype)


def test_a_sum_just_above_a_tie_rounds_up():
    x, w = torch.tensor([[1.0, 2.0**-24, 2.0**-43]] * 17), torch.tensor([[1.0, 1.0, 2.0**-20]] * 18)
    assert bool((residue_product(x, w).result != 1.0).all())
    assert bool((det_gemm(x, w) == 1.0 + 2.0**-23).all())


def test_ties_settle_where_the_integer_sum_is_exact():
    # 1 + 2**-24 is a tie between 1 and 1 + 2**-23: settled only because the bound is zero
    x, w = torch.tensor([[1.0, 2.0**-24]] * 17), torch.ones((18, 2))
    settled = residue_product(x, w)
    assert bool(settled.done.all()) and bool((settled.result == 1.0).all())


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_det_gemm_through_the_residue_stage_has_the_oracles_bits(kind, dtype):
    generator = torch.Generator().manual_seed(4 + len(kind))
    x, w = KINDS[kind](21, 6, 130, dtype, generator)  # small: some kinds send every output to the exact accumulator
    assert residue_stage.applies(x, w, torch.float32)
    assert same_bits(det_gemm(x, w), oracle_gemm(x, w, BINARY32))
    stats = bounded_gemm.last_statistics
    assert stats.first_settled + stats.pairs_settled + sum(stats.settled_after) + stats.fallback == stats.outputs


def test_panels_of_rows_and_strided_operands_give_the_same_bits(monkeypatch):
    generator = torch.Generator().manual_seed(5)
    x, w = torch.randn((300, 50), generator=generator), torch.randn((40, 50), generator=generator)
    whole = residue_product(x, w)
    monkeypatch.setattr(residue_stage, "PLANE_BYTES", 12 * 64 * 128)  # panels of 128 rows, the last of 44
    panels = residue_product(x, w)
    assert torch.equal(panels.done, whole.done) and same_bits(panels.result, whole.result)
    strided = residue_product(x.T.contiguous().T, w.T.contiguous().T[:, :])
    assert same_bits(strided.result, whole.result)
    assert same_bits(det_gemm(x[:, ::2], w[:, ::2]), oracle_gemm(x[:, ::2], w[:, ::2], BINARY32))


def test_small_and_edge_shapes():
    generator = torch.Generator().manual_seed(6)
    for m, n, k in [(1, 1, 1), (1, 5, 17), (33, 1, 3), (2, 3, 1)]:
        x, w = torch.randn((m, k), generator=generator), torch.randn((n, k), generator=generator)
        assert same_bits(det_gemm(x, w), oracle_gemm(x, w, BINARY32)), (m, n, k)


def test_where_the_stage_applies():
    x = torch.ones((4, 8))
    assert residue_stage.applies(x, x, torch.float32)
    assert not residue_stage.applies(x, x, torch.bfloat16)  # bf16 results: the float64 product
    assert not residue_stage.applies(torch.ones((4, 0)), torch.ones((4, 0)), torch.float32)
    with implementations.device_paths(False):
        assert not residue_stage.applies(x, x, torch.float32)  # the CPU's own path: the float64 product
    wide = torch.ones((2, MAX_K + 16))
    assert not residue_stage.applies(wide, wide, torch.float32)


def test_short_products_and_operands_of_few_rows_take_the_float64_product(monkeypatch):
    monkeypatch.setattr(residue_stage, "MIN_K", SHORTEST)
    monkeypatch.setattr(residue_stage, "MIN_ROWS", FEWEST)
    short, long = torch.empty((FEWEST, SHORTEST - 1)), torch.empty((FEWEST, SHORTEST))
    assert not residue_stage.applies(short, short, torch.float32)
    assert residue_stage.applies(long, long, torch.float32)
    assert not residue_stage.applies(long, long[: FEWEST - 1], torch.float32)
    assert not residue_stage.applies(long[: FEWEST - 1], long, torch.float32)
    generator = torch.Generator().manual_seed(8)
    x, w = torch.randn((3, 40), generator=generator), torch.randn((4, 40), generator=generator)
    det_gemm(x, w)
    assert bounded_gemm.last_statistics.first_stage == "float64"


def test_forcing_the_float64_product_gives_the_same_bits():
    generator = torch.Generator().manual_seed(7)
    x, w = KINDS["one outlier per row"](20, 20, 64, torch.float32, generator)
    with bounded_gemm.forced("float64"):
        by_float64 = det_gemm(x, w)
    assert same_bits(det_gemm(x, w), by_float64)
