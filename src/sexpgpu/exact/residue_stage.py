"""det_gemm's first stage on int8 tensor cores: x @ w.T of row-scaled operands, exactly, by residues.

Each row of x (and of w) is scaled by a power of two 2**s, chosen from a bound of its norm so
that the scaled row's norm stays below 2**(c - 1), and rounded to integers: xi = rint(x 2**s),
|x 2**s - xi| <= 1/2 elementwise. Then ||xi|| <= 2**c, and for one output

    A = sum_k xi[m, k] wi[n, k],      |A| <= ||xi[m]|| ||wi[n]|| <= 2**(2c) <= P / 4,

where P is the product of pairwise coprime moduli of at most 256. A is computed exactly from
its residues: xi modulo each modulus is a signed int8 (one plane a modulus), each plane pair
is multiplied on the int8 tensor cores (a Triton kernel: int32 sums of K products of magnitude
at most 2**14, exact for K < 2**17) and reduced modulo its modulus there, and the Chinese
remainder theorem rebuilds A: with y_i the product modulo m_i and c_i = (P / m_i) ((P / m_i)**-1 mod m_i),

    A = sum_i y_i c_i - q P,      q = the nearest integer to sum_i y_i c_i / P,

exact in float64 words of 32 bits (every word's terms are integers below 2**53), q unambiguous
because |A| <= P / 4. The words are added from the top by TwoSum, whose errors are exact: their
magnitudes bound the sum's own error, zero whenever A's bits fit one float64.

What the rounding to integers cut off is bounded, not computed: with rx = x - xi 2**-s, a
vector whose norm the first pass bounds (in x's units),

    |x.w - A 2**-(s+t)| <= ||rx|| ||w|| + (||x|| + ||rx||) ||rw||,

zero where both rows are exact on the grid: randn f32 rows of 8192 with 12 moduli lose bits
only in elements below about 2**-15 (2**-45 of 2**7), a fifth of the rows. The output is settled by
settle_kernel's test on A 2**-(s+t) and that bound; as after the float64 product, the rest
go on to the pair sums (bounded_gemm.py). Each output is its exact sum's rounding either way: the
moduli decide only the time.

The time is COUNT int8 products. f32 operands take 12 (P of 95 bits, c = 46: a row's grid, 2**-s,
lies 2**-45 below its norm's power of two); 11 left 582,000 of 8192**2 randn outputs to the
pair sums and took 25.4 ms on an H200, 12 left 5,100 (20.8 ms), 13 left 24 (21.8 ms). bf16
operands take 10 (c = 38): their products have 16 bits, so most sums are exact, but at 9 the
grid cut the smallest elements of some rows and left 298,000 outputs (18.7 ms against 17.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import torch

from . import implementations
from .block_slices import round_up
from .float64_stage import SLACK, gamma, upward_float32

MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217, 211)  # pairwise coprime
COUNT = {torch.float32: 12, torch.bfloat16: 10}  # moduli by the operands' dtype (measured: residue_stage in docs/exact.md)
MAX_K = (1 << 17) - 16  # K * 128**2 < 2**31: the int32 sums cannot overflow
# Below this K the float64 product is the faster first stage: the residues cost COUNT bytes
# written and read per output whatever K is, the float64 product only its K flops. On an H200,
# gpt-50m's products of K = 512 took 45.3 ms by residues against 39.0 by float64, K = 2048 9.8
# against 10.2 (docs/exact.md, the residue stage's "Cost")
MIN_K = 4096
# ... and an operand of fewer rows leaves the residues' pass (a program per BLOCK_R rows, each
# walking all of K twice) too few programs: gpt-50m's weight gradients (512 to 2048 rows of
# 16384 tokens) spent 60.0 of their 94.3 ms of kernels there
MIN_ROWS = 4096
PLANE_BYTES = 1 << 31  # the products (an int8 a modulus and output) of at most this many bytes live at once
BLOCK_COLUMNS = 128  # a residue program's columns: its lanes for the norm's sum (its bits: one tile for all)
GROUP_M = 8  # row tiles of the products that share their operands in L2


class Tiles(NamedTuple):
    """The residue and reconstruction programs' tiles: functions of the device's kind alone.
    Each row's residues and each output's reconstruction are computed alone, so the tiles
    decide only the time."""

    residue_rows: int
    output_rows: int
    output_columns: int


# Triton's interpreter runs each program's operations one by one in Python: there fewer,
# larger programs take a fraction of the time (the tests' shapes are small)
TILES = {"compiled": Tiles(8, 16, 64), "interpreted": Tiles(64, 64, 64)}


class ProductShape(NamedTuple):
    """A residue product program's tile, warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int


# On an H200 at 8192^3 LARGE ran at 1093 TOPS (int32 results), against 899 to 944 for
# cuBLASLt's (torch._int_mm, an SM80 kernel); 128 x 128 x 128 with 4 warps at 953, with 8 at 891.
# Operands narrower than its tile take SMALL, which pads them less. Under Triton's interpreter
# a program's cost is mostly its operations' count, so there the tile is larger than SMALL.
LARGE, SMALL = ProductShape(128, 256, 128, 8, 3), ProductShape(32, 32, 32, 4, 2)
INTERPRETED_PRODUCT = ProductShape(64, 64, 32, 4, 2)


def product_shape(m: int, n: int, device: torch.device) -> ProductShape:
    if implementations.launch_kind(device) == "interpreted":
        return INTERPRETED_PRODUCT
    return LARGE if m >= LARGE.block_m and n >= LARGE.block_n else SMALL


COLUMNS = 7  # a modulus's row in the table: m, 1/m, c/P, c's four words


@dataclass(frozen=True)
class Moduli:
    """The first `count` moduli and the constants of their reconstruction."""

    count: int
    product: int  # P
    top: int  # c: scaled rows' norms stay at most 2**c, so |A| <= 2**(2c) <= P / 4
    words: int  # words of 32 bits that hold P

    @classmethod
    def first(cls, count: int) -> "Moduli":
        product = math.prod(MODULI[:count])
        return cls(count, product, (product.bit_length() - 3) // 2, -(-product.bit_length() // 32))

    def table(self, device: torch.device) -> tuple:
        """(float64 (count, COLUMNS): m, 1/m, c/P and c's words; float64 (4,): P's words)."""
        return _tables(self, device)


@cache
def _tables(moduli: Moduli, device: torch.device) -> tuple:
    rows = []
    for m in MODULI[: moduli.count]:
        cofactor = moduli.product // m
        c = cofactor * pow(cofactor, -1, m) % moduli.product
        rows.append([float(m), 1.0 / m, c / moduli.product, *_words(c)])
    # copied without a wait (the queued path reads nothing back and waits for nothing)
    table = torch.tensor(rows, dtype=torch.float64).to(device, non_blocking=True)
    return table, torch.tensor(_words(moduli.product), dtype=torch.float64).to(device, non_blocking=True)


def _words(value: int) -> list[float]:
    return [float((value >> (32 * j)) & 0xFFFFFFFF) for j in range(4)]


def applies(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether det_gemm's first stage is this one: float32 results of operands of MIN_K <= K <= MAX_K
    and at least MIN_ROWS rows each, on the device paths of a device with int8 tensor cores."""
    return (dtype == torch.float32 and MIN_K <= x.shape[1] <= MAX_K and min(x.shape[0], w.shape[0]) >= MIN_ROWS
            and implementations.on_device(x.device) and implementations.int8_tensor_cores(x.device))


@dataclass
class Settled:
    """A first stage's outcome: which outputs it settled, their values, and the rows' norms the
    pair sums bound by."""

    done: torch.Tensor  # bool (M, N)
    result: torch.Tensor  # float32 (M, N): settled values, +0.0 elsewhere
    x_norm: torch.Tensor  # float64 (M,): at least ||x[m]||_2
    w_norm: torch.Tensor  # float64 (N,)


@dataclass
class Residues:
    """One operand's residue planes and its rows' scales and bounds."""

    planes: torch.Tensor  # int8 (count, rows padded, K padded)
    norm: torch.Tensor  # float64 (rows,): at least ||row||
    residual: torch.Tensor  # float64 (rows,): at least ||row - rint(row 2**s) 2**-s||
    unscale: torch.Tensor  # float64 (rows,): 2**-s


def residue_product(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> Settled:
    """The stage for bf16 or f32 x (M, K) and w (N, K), K <= MAX_K: the outputs it settles.
    No output of a row holding a NaN or an infinity is settled (its norm's bound is not
    finite). out: a contiguous float32 tensor of M * N elements to write the result into, or None."""
    moduli = Moduli.first(COUNT[x.dtype])
    x, w = along_rows(x), along_rows(w)
    (m, k), n = x.shape, w.shape[0]
    shape = product_shape(m, n, x.device)
    xs, ws = residues(x, moduli, shape.block_m, shape.block_k), residues(w, moduli, shape.block_n, shape.block_k)
    done = torch.empty((m, n), dtype=torch.int8, device=x.device)
    result = torch.empty((m, n), dtype=torch.float32, device=x.device) if out is None else out.view(m, n)
    padded_n = ws.planes.shape[1]
    panel = max(1, PLANE_BYTES // (moduli.count * padded_n) // shape.block_m) * shape.block_m
    for r0 in range(0, m, panel):
        rows = min(panel, m - r0)
        products = _products(xs, ws, r0, round_up(rows, shape.block_m), moduli, shape)
        _reconstruct(products, xs, ws, r0, rows, n, moduli, result[r0 : r0 + rows], done[r0 : r0 + rows])
    return Settled(done.view(torch.bool), result, xs.norm, ws.norm)


def along_rows(t: torch.Tensor) -> torch.Tensor:
    """`t` with contiguous rows, copied if they are not: the residues read a row at a time. A
    transposed operand (a weight's gradient reads its activations so) of 512 x 16384 took 1.16 ms
    a call read in place on an H200, 0.6 ms after a copy of 0.08 ms."""
    return t if t.stride(1) == 1 else t.contiguous()


def _products(xs: Residues, ws: Residues, r0: int, rows: int, moduli: Moduli, shape: ProductShape) -> torch.Tensor:
    """int8 (count, rows, N padded): the products of x's planes' rows r0 .. r0 + rows and w's
    planes, each modulo its modulus."""
    from .residue_kernel import _residue_products  # Triton is imported only where it runs

    _, padded_m, padded_k = xs.planes.shape
    padded_n = ws.planes.shape[1]
    products = torch.empty((moduli.count, rows, padded_n), dtype=torch.int8, device=xs.planes.device)
    block_m, block_n, block_k = shape.block_m, shape.block_n, shape.block_k
    table, _ = moduli.table(products.device)
    grid = ((rows // block_m) * (padded_n // block_n), moduli.count)
    _residue_products[grid](xs.planes[:, r0:], ws.planes, products, table, rows, padded_m * padded_k,
                            padded_n * padded_k, padded_n, padded_k, BLOCK_M=block_m, BLOCK_N=block_n,
                            BLOCK_K=block_k, GROUP_M=GROUP_M, COLUMNS=COLUMNS, num_warps=shape.warps,
                            num_stages=shape.stages, enable_fp_fusion=False)
    return products


def residues(rows: torch.Tensor, moduli: Moduli, row_multiple: int, column_multiple: int) -> Residues:
    """The residue planes of rows (R, K), padded with zeros to multiples of row_multiple rows
    and column_multiple columns (a product tile's, so that no load of the products is masked),
    with the rows' bounds."""
    from .residue_kernel import _residues  # Triton is imported only where it runs

    rows = rows.float() if rows.dtype == torch.bfloat16 else rows  # exact; the kernel reads float32
    r, k = rows.shape
    padded_r, padded_k = round_up(max(r, 1), row_multiple), round_up(k, column_multiple)
    planes = torch.empty((moduli.count, padded_r, padded_k), dtype=torch.int8, device=rows.device)
    norm, residual, unscale = (torch.empty(r, dtype=torch.float64, device=rows.device) for _ in range(3))
    table, _ = moduli.table(rows.device)
    # a square's sum over the lanes and their join: at most K + BLOCK_COLUMNS additions, and
    # each residual's square rounds once; the factor also covers the square root's rounding
    raise_factor = upward_float32(max(1 + 2 * gamma(k + BLOCK_COLUMNS + 2), SLACK))
    block_rows = TILES[implementations.launch_kind(rows.device)].residue_rows
    grid = (-(-padded_r // block_rows),)
    _residues[grid](rows, planes, norm, residual, unscale, table, r, padded_r, k, padded_k, rows.stride(0),
                    rows.stride(1), moduli.top, raise_factor, COUNT=moduli.count, COLUMNS=COLUMNS,
                    BLOCK_R=block_rows, BLOCK_K=BLOCK_COLUMNS, num_warps=4, enable_fp_fusion=False)
    return Residues(planes, norm, residual, unscale)


def _reconstruct(products, xs: Residues, ws: Residues, r0: int, rows: int, n: int, moduli: Moduli, value, done):
    from .residue_kernel import _reconstruct as reconstruct

    table, words = moduli.table(products.device)
    chosen = TILES[implementations.launch_kind(products.device)]
    block_m, block_n = chosen.output_rows, chosen.output_columns
    grid = (-(-rows // block_m), -(-n // block_n))
    part = slice(r0, r0 + rows)
    reconstruct[grid](products, xs.unscale[part], xs.norm[part], xs.residual[part], ws.unscale, ws.norm,
                      ws.residual, table, words, value, done, rows, n, products.shape[1], products.shape[2],
                      upward_float32(SLACK), COUNT=moduli.count, COLUMNS=COLUMNS, WORDS=moduli.words,
                      BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, enable_fp_fusion=False)
