"""det_gemm's fast path: round wherever a bound proves the rounding, else add every bit.

Three stages, each rounding the outputs its bound settles and handing on the rest:
1. on a GPU with int8 tensor cores, the exact product of row-scaled integers by residues with a
   bound of what the scaling's rounding cut off (residue_stage.py); elsewhere one float64
   product with a bound that holds for any summation order (float64_stage.py);
2. compensated dot products of the few outputs left, from their own rows (pair_sums.py);
3. when more than a PAIR_SHARE of the outputs are left (data that cancel), the tiers below
   on the block of their rows and columns; then the exact accumulator for what remains.

The tiers: round from the top slices.

Each row of x and of w gets one exponent R over all of K, with every |element| < 2**R, and is
cut from the top down into signed slices of W bits (sign and magnitude, |digit| < 2**W):

    x[m, k] = sum_{t < T} X_t[m, k] * 2**(Rx[m] - W(t+1)) + rx_T[m, k],   |rx_T[m, k]| < 2**(Rx[m] - W T)

Slice pairs of equal weight t + u form a tier. Tier T's integer sums S_T = sum_{t+u=T} X_t @ W_u.T
come from one exact integer product (the pairs are laid side by side along K), and

    x @ w.T = 2**(Rx[m] + Rw[n]) * (sum_T S_T * 2**(-W(T+2)))

exactly, summed over every tier. After tiers 0..T the pairs not yet summed are, grouping them
by x's slice t (pairs t <= T, u > T - t) and by x's remainder (every t > T):

    missing = sum_{t <= T} X_t 2**(Rx-W(t+1)) @ rw_{T-t}.T  +  rx_{T+1} @ w.T

so, with |rw_j| < 2**(Rw - W(j+1)) and |rx_{T+1}| < 2**(Rx - W(T+1)) elementwise,

    |missing[m, n]| <= 2**(Rx+Rw) * (2**(-W(T+2)) * Nx_T[m] + 2**(-W(T+1)) * nu[n])          (1)

where Nx_T[m] = sum_{t <= T} sum_k |X_t[m, k]| (an exact integer) and nu[n] = sum_k |w[n, k]| / 2**Rw[n].
Once every pair is summed, the truncation is zero. The running sum A' = sum_T S_T 2**(-W(T+2))
is kept in float64: S_T * 2**(-W(T+2)) is exact when |S_T| < 2**53 (else its conversion errs
by at most 2**-53 of it), and each addition errs by at most 2**-53 of its result, so

    |exact / 2**(Rx+Rw) - A'| <= (1) / 2**(Rx+Rw) + 2**-52 * (sum of |A'| after each addition
                                                              [+ |increment| where inexact])

The doubled unit (2**-52 for 2**-53) and a final factor 1 + 2**-40 cover the rounding of the
bound's own few float64 operations (nu's float64 sum gets a factor 1 + (K+1) 2**-52). Scaling by
2**(Rx+Rw) is exact, which gives A and E with |exact - A| <= E.

An output is settled when [A - E, A + E] lies strictly inside the rounding cell of q, the
float32 (or bfloat16) that A converts to: strictly between the midpoints from q to its two
neighbours. Every real there rounds to q, so q is the exact sum's rounding whatever A is and
however q was obtained; the check itself proves it. Zero, infinities and the largest finite
value's upper neighbour are handled apart: q = 0 is never settled (the two zeros and the
smallest subnormal meet there) unless E = 0 and A = 0, an exact zero, which is +0.0; q = +-inf
is never settled; the neighbour above the largest finite value is taken as 2**128, the
library's overflow point. The gaps |A| - midpoint are exact float64 differences (A lies in
q's cell, whose midpoints are multiples of A's last place or within a factor two of A).

Tiers run while outputs remain unsettled, on the rows and columns that hold them; outputs
still unsettled after every pair (exact ties, cancellation below the bound) or after
MAX_BOUND_BITS of tiers are computed by the exact accumulator and rounded, so the result is
the same bits as the exact path for every input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import implementations, residue_stage
from .accumulator import normalise_
from .layout import MAX_K_PER_CALL
from .block_slices import (
    SliceProducts,
    _bit_length,
    fp64_products,
    int8_reference_products,
    int8_tensor_core_products,
)
from .bins_kernel import split_floats
from .float64_stage import SLACK, UNIT, Float64Product, float64_product
from .pair_sums import pair_sums
from .paths import FLOAT64_ONLY, TIER_NAMES, forced, forced_path as _forced_path  # noqa: F401  (rounded.forced: the tests' entry)
from .residue_stage import Settled
from .rounding import FORMATS, apply_special_counts, power_of_two, round_planes

# int8 sums over 2**17 columns stay below 2**17 * 127**2 < 2**31; fp64 integer sums of 20-bit
# slices over 2**13 columns below 2**53. A tier's pairs share one call up to those widths.
TIER_INT8 = SliceProducts(7, 1 << 17, torch.int8, int8_tensor_core_products, exact_bits=31)
TIER_INT8_ON_CPU = SliceProducts(7, 1 << 17, torch.int8, int8_reference_products, exact_bits=31)
TIER_FP64 = SliceProducts(20, 1 << 13, torch.float64, fp64_products, exact_bits=53)

MAX_BOUND_BITS = 160  # stop tiering once the bound is 2**-160 of the terms: the rest is cancellation
MAX_FAST_K = 1 << 24  # beyond this K the exact path runs (tier sums stay far inside float64's range)
SAMPLE = 4096  # outputs sampled to decide whether checking a tier is worth its cost
PAIR_SHARE = 1 / 8  # at most this share of the outputs left after the float64 product go to pair_sums
PAIR_MINIMUM = 1 << 12  # ... or at most this many
PAIR_FALLBACK_LIMIT = 1 << 18  # the exact fallback takes outputs one by one up to this many
SETTLE_OUTPUTS = 1 << 18  # outputs the host path settles at a time


def _tier_products(device: torch.device) -> SliceProducts:
    """int8 tensor cores where the GPU has them, else exact fp64 products of 20-bit slices."""
    if _forced_path() in TIERS_BY_NAME:
        return TIERS_BY_NAME[_forced_path()](device)
    if implementations.on_device(device) and implementations.int8_tensor_cores(device):
        return TIERS_BY_NAME["int8"](device)
    return TIER_FP64


TIERS_BY_NAME = {
    "int8": lambda device: TIER_INT8 if device.type == "cuda" else TIER_INT8_ON_CPU,
    "fp64": lambda device: TIER_FP64,
}
assert tuple(TIERS_BY_NAME) == TIER_NAMES


@dataclass
class Statistics:
    """What the last call did: for benchmarks and tests."""

    first_stage: str = ""  # "residues" (the residue product, residue_stage.py) or "float64" (the float64 product)
    first_settled: int = 0  # outputs settled by the first stage
    pairs: int = 0  # outputs sent to pair_sums
    pairs_settled: int = 0  # ... and settled there
    tiers: int = 0  # tiers computed
    checks: int = 0  # tiers after which outputs were checked
    outputs: int = 0
    fallback: int = 0  # outputs computed by the exact accumulator
    settled_after: list[int] = field(default_factory=list)  # outputs settled at each check


last_statistics = Statistics()


def rounded_gemm(x: torch.Tensor, w: torch.Tensor, special, dtype: torch.dtype,
                 exact_planes) -> torch.Tensor:
    """x @ w.T for finite x (M, K), w (N, K), rounded once into dtype; `special` the counts of
    non-finite products (or None); exact_planes(x, w) the exact accumulator's planes."""
    global last_statistics
    stats = last_statistics = Statistics(outputs=x.shape[0] * w.shape[0])
    m, n = x.shape[0], w.shape[0]
    if m * n == 0 or x.shape[1] > MAX_FAST_K:
        planes = exact_planes(x, w)
        stats.fallback = m * n
        return round_planes(_with_special(planes, special), dtype)
    if _forced_path() in TIERS_BY_NAME:
        result, pending_rows, pending_cols = _tiers(x, w, dtype, _tier_products(x.device), stats)
    else:
        result, pending_rows, pending_cols = _float64_stages(x, w, dtype, stats)
    if special is not None:
        keep = (special[:, pending_rows, pending_cols] == 0).all(0)
        pending_rows, pending_cols = pending_rows[keep], pending_cols[keep]
    if pending_rows.numel():
        stats.fallback = pending_rows.numel()
        result[pending_rows, pending_cols] = _exact_outputs(x, w, pending_rows, pending_cols, dtype, exact_planes)
    return result if special is None else apply_special_counts(result, special)


def _float64_stages(x, w, dtype, stats: Statistics):
    """Stages 1 to 3 of the module's docstring: (result with settled outputs filled, rows and
    columns of those still pending)."""
    # Each count below is the size of a list the next step needs anyway: the only waits for
    # the GPU are the pending list and the list of outputs the pair sums leave.
    first = _first_stage(x, w, dtype, stats)
    result, pending = first.result, ~first.done
    del first.done
    rows, cols = pending.nonzero(as_tuple=True)
    stats.first_settled = pending.numel() - rows.numel()
    share = max(PAIR_MINIMUM, int(PAIR_SHARE * pending.numel()))
    if rows.numel() > share and _forced_path() != FLOAT64_ONLY:
        return _tiers_on_block(x, w, dtype, result, pending, stats)
    stats.pairs = rows.numel()
    refined, bound = pair_sums(x, w, rows, cols, first.x_norm, first.w_norm)
    done, value = settle(refined, bound, None, dtype)
    result[rows, cols] = torch.where(done, value, result[rows, cols])
    left = (~done).nonzero()[:, 0]
    stats.pairs_settled = stats.pairs - left.numel()
    return result, rows[left], cols[left]


def _first_stage(x, w, dtype, stats: Statistics) -> Settled:
    """Stage 1: the residue product on int8 tensor cores where it applies (residue_stage.py),
    else the float64 product; rounded.forced("float64") takes the float64 product."""
    if residue_stage.applies(x, w, dtype) and _forced_path() != FLOAT64_ONLY:
        stats.first_stage = "residues"
        return residue_stage.residue_product(x, w)
    stats.first_stage = "float64"
    product = float64_product(x, w)
    done, result = _settled_product(product, dtype)
    return Settled(done, result, product.x_norm, product.w_norm)


def _settled_product(first: Float64Product, dtype: torch.dtype):
    """(settled, result with the settled values, +0.0 elsewhere) for the float64 product: one
    fused pass on CUDA for float32 results (settle_kernel.py), else settle on the formed bound."""
    if implementations.on_device(first.total.device) and dtype == torch.float32:
        from .settle_kernel import settle_float32  # Triton is imported only where it runs

        return settle_float32(first.total, first.x_norm, first.w_norm, first.factor)
    total = first.total
    done = torch.empty(total.shape, dtype=torch.bool, device=total.device)
    result = torch.empty(total.shape, dtype=dtype, device=total.device)
    # on a CPU, blocks small enough for its caches (20 -> 11 ms at 1024^2); a GPU takes one
    rows = max(1, SETTLE_OUTPUTS // max(total.shape[1], 1)) if total.device.type == "cpu" else total.shape[0]
    for r0 in range(0, total.shape[0], max(rows, 1)):
        part = slice(r0, r0 + rows)
        bound = torch.outer(first.x_norm[part], first.w_norm).mul_(first.factor)
        settled, value = settle(total[part], bound, None, dtype)
        done[part], result[part] = settled, torch.where(settled, value, torch.zeros((), dtype=dtype, device=value.device))
    return done, result


def _tiers_on_block(x, w, dtype, result, pending, stats: Statistics):
    """Stage 3: the tiers on the rows and columns that hold pending outputs."""
    row_set, col_set = pending.any(1).nonzero()[:, 0], pending.any(0).nonzero()[:, 0]
    block, tier_rows, tier_cols = _tiers(x[row_set], w[col_set], dtype, _tier_products(x.device), stats)
    still = torch.zeros_like(block, dtype=torch.bool)
    still[tier_rows, tier_cols] = True
    wanted = pending[row_set[:, None], col_set[None, :]]
    current = result[row_set[:, None], col_set[None, :]]
    result[row_set[:, None], col_set[None, :]] = torch.where(wanted & ~still, block, current)
    left = (wanted & still).nonzero()
    return result, row_set[left[:, 0]], col_set[left[:, 1]]


def _with_special(planes: torch.Tensor, special) -> torch.Tensor:
    if special is not None:
        planes[-3:] += special
    return normalise_(planes)


def _exact_outputs(x, w, rows, cols, dtype, exact_planes) -> torch.Tensor:
    """The exact path for the outputs (rows[i], cols[i]): on CUDA, when they are not too many, each
    from its own row and column (triton_kernel.accumulate_pairs); else one block over the rows
    and columns involved, whose tiled kernels do more work per output but run at GEMM speed."""
    if implementations.on_device(x.device) and rows.numel() <= PAIR_FALLBACK_LIMIT:
        return round_planes(_pair_planes(x, w, rows, cols), dtype)
    row_set, row_at = torch.unique(rows, return_inverse=True)
    col_set, col_at = torch.unique(cols, return_inverse=True)
    planes = normalise_(exact_planes(x[row_set], w[col_set]))
    return round_planes(planes, dtype)[row_at, col_at]


def _pair_planes(x, w, rows, cols) -> torch.Tensor:
    """Normalised (WIDTH, P) planes of the listed outputs, K carried in calls of MAX_K_PER_CALL."""
    from .triton_kernel import accumulate_pairs  # Triton is imported only where it runs

    planes = None
    for k0 in range(0, max(x.shape[1], 1), MAX_K_PER_CALL):
        part = accumulate_pairs(x[:, k0 : k0 + MAX_K_PER_CALL], w[:, k0 : k0 + MAX_K_PER_CALL], rows, cols)
        planes = normalise_(part if planes is None else planes.add_(part))
    return planes


@dataclass
class TopSlices:
    """One operand cut from each row's top: slices made on demand, with their |digit| sums."""

    significand: torch.Tensor  # int64 (rows, K), signed
    exponent: torch.Tensor  # int64 (rows, K): the weight of the significand's unit
    top: torch.Tensor  # int64 (rows,): R, every |element| of the row is below 2**R
    count: int  # slices that hold every bit of every row
    width: int
    dtype: torch.dtype
    pieces: dict = field(default_factory=dict)
    digit_sums: dict = field(default_factory=dict)

    @classmethod
    def of(cls, t: torch.Tensor, products: SliceProducts) -> "TopSlices":
        significand, exponent = split_floats(t)
        magnitude = significand.abs()
        nonzero = magnitude != 0
        top_bits = exponent + _bit_length(magnitude)
        lowest = exponent + _bit_length(magnitude & -magnitude) - 1
        top = torch.zeros(t.shape[0], dtype=torch.int64, device=t.device)
        if t.shape[1]:  # all-zero rows keep R = 0: any exponent would do, their slices are zero
            highest = torch.where(nonzero, top_bits, torch.iinfo(torch.int64).min).amax(1)
            top = torch.where(nonzero.any(1), highest, top)
        spans = torch.where(nonzero, top[:, None] - lowest, 0)
        width = products.slice_bits
        count = int(((spans + width - 1) // width).max()) if spans.numel() else 0
        return cls(significand, exponent, top, count, width, products.slice_dtype)

    def piece(self, t: int) -> torch.Tensor:
        """Slice t: the bits of weight 2**(R - W(t+1)) .. 2**(R - W t), with the element's sign."""
        if t not in self.pieces:
            shift = self.exponent - (self.top[:, None] - self.width * (t + 1))
            magnitude = self.significand.abs()
            up = magnitude << shift.clamp(0, self.width)
            down = magnitude >> (-shift).clamp(0, 40)
            digits = torch.where(shift >= 0, up, down) & ((1 << self.width) - 1)
            self.digit_sums[t] = digits.sum(1)
            self.pieces[t] = torch.where(self.significand < 0, -digits, digits).to(self.dtype)
        return self.pieces[t]

    def digit_sum_through(self, tier: int) -> torch.Tensor:
        """Nx_T: sum over slices t <= tier of sum_k |X_t[m, k]|, exact int64."""
        for t in range(tier + 1):
            self.piece(t)
        return sum(self.digit_sums[t] for t in range(tier + 1))

    def scaled_norm(self) -> torch.Tensor:
        """nu: an upper bound of sum_k |row_k| / 2**R, float64 (its summation error allowed for)."""
        scaled = self.significand.abs().to(torch.float64) * power_of_two(self.exponent - self.top[:, None])
        k = self.significand.shape[1]
        return scaled.sum(1) * (1 + (k + 1) * UNIT)


def _tier_sum(xs: TopSlices, ws: TopSlices, tier: int, rows, cols, products: SliceProducts) -> torch.Tensor:
    """S_T = sum_{t+u=T} X_t @ W_u.T on the active rows and columns, exact int64."""
    k = xs.significand.shape[1]
    pairs = [(t, tier - t) for t in range(tier + 1) if t < xs.count and tier - t < ws.count]
    pieces = [(t, u, k0) for t, u in pairs for k0 in range(0, k, products.k_block)]
    total = torch.zeros((rows.numel(), cols.numel()), dtype=torch.int64, device=xs.top.device)
    while pieces:
        call, width = [], 0
        while pieces and width + min(k - pieces[0][2], products.k_block) <= products.k_block:
            t, u, k0 = pieces.pop(0)
            call.append((t, u, k0))
            width += min(k - k0, products.k_block)
        a = torch.cat([xs.piece(t)[rows, k0:k0 + products.k_block] for t, _, k0 in call], 1)
        b = torch.cat([ws.piece(u)[cols, k0:k0 + products.k_block] for _, u, k0 in call], 1)
        total += products.multiply(a, b).to(torch.int64)
    return total


def _tiers(x, w, dtype, products: SliceProducts, stats: Statistics):
    """The tier loop: (result with settled outputs filled, rows and columns of those still pending)."""
    device = x.device
    xs, ws = TopSlices.of(x, products), TopSlices.of(w, products)
    width = products.slice_bits
    last_tier = max(xs.count + ws.count - 2, 0)
    nu = ws.scaled_norm()
    result = torch.zeros((x.shape[0], w.shape[0]), dtype=dtype, device=device)
    rows = torch.arange(x.shape[0], device=device)
    cols = torch.arange(w.shape[0], device=device)
    total = torch.zeros((rows.numel(), cols.numel()), dtype=torch.float64, device=device)  # A'
    rounding = torch.zeros_like(total)  # the sum of every float64 rounding error so far
    pending = torch.ones_like(total, dtype=torch.bool)
    k = x.shape[1]
    for tier in range(last_tier + 1):
        stats.tiers += 1
        sums = _tier_sum(xs, ws, tier, rows, cols, products)
        increment = sums.to(torch.float64)
        if k * (tier + 1) * ((1 << width) - 1) ** 2 >= 1 << 53:  # the conversion may round
            rounding += (sums - increment.to(torch.int64)).abs().to(torch.float64) * 2.0 ** (-width * (tier + 2))
        increment *= 2.0 ** (-width * (tier + 2))
        total = _add_counting_error(total, increment, rounding)
        final = tier == last_tier or width * (tier + 1) >= MAX_BOUND_BITS
        if not final and not _worth_checking(xs, ws, nu, tier, rows, cols, total, rounding, pending, dtype):
            continue
        stats.checks += 1
        bound = _bound(xs, nu, tier, rows, cols, rounding, exhausted=tier == last_tier)
        done, value = settle(total, bound, _scale(xs, ws, rows, cols), dtype)
        newly = done & pending
        stats.settled_after.append(int(newly.sum()))
        block = result[rows[:, None], cols[None, :]]
        result[rows[:, None], cols[None, :]] = torch.where(newly, value, block)
        pending &= ~done
        if final or not bool(pending.any()):
            break
        keep_rows, keep_cols = pending.any(1), pending.any(0)
        rows, cols = rows[keep_rows], cols[keep_cols]
        total, rounding, pending = (t[keep_rows][:, keep_cols] for t in (total, rounding, pending))
    where = pending.nonzero()
    return result, rows[where[:, 0]], cols[where[:, 1]]


def _add_counting_error(total: torch.Tensor, increment: torch.Tensor, rounding: torch.Tensor) -> torch.Tensor:
    """total + increment in float64, adding the addition's exact error (Knuth's TwoSum) to rounding."""
    result = total + increment
    increment_part = result - total
    error = (total - (result - increment_part)) + (increment - increment_part)
    rounding += error.abs()
    return result


def _scale(xs: TopSlices, ws: TopSlices, rows, cols) -> torch.Tensor:
    """2**(Rx[m] + Rw[n]) as float64, exact (a power of two inside float64's normal range)."""
    return power_of_two(xs.top[rows][:, None] + ws.top[cols][None, :])


def _bound(xs, nu, tier, rows, cols, rounding, exhausted: bool, outer: bool = True) -> torch.Tensor:
    """E / 2**(Rx+Rw): inequality (1) of the module's docstring plus the float64 summation error,
    for the block rows x cols (outer) or for the outputs (rows[i], cols[i])."""
    if exhausted:
        return rounding * SLACK
    along_x = xs.digit_sum_through(tier)[rows].to(torch.float64) * 2.0 ** (-xs.width * (tier + 2))
    along_w = nu[cols] * 2.0 ** (-xs.width * (tier + 1))
    truncation = along_x[:, None] + along_w[None, :] if outer else along_x + along_w
    return (truncation + rounding) * SLACK


def _worth_checking(xs, ws, nu, tier, rows, cols, total, rounding, pending, dtype) -> bool:
    """Whether at least half of a sample of pending outputs would settle now (speed only)."""
    spots = pending.nonzero()
    if spots.shape[0] > SAMPLE:
        # integer spacing: a float32 linspace rounds N - 1 up to N once N passes 2**24
        pick = torch.arange(SAMPLE, device=spots.device) * (spots.shape[0] - 1) // (SAMPLE - 1)
        spots = spots[pick]
    r, c = spots[:, 0], spots[:, 1]
    bound = _bound(xs, nu, tier, rows[r], cols[c], rounding[r, c], exhausted=False, outer=False)
    scale = power_of_two(xs.top[rows[r]] + ws.top[cols[c]])
    done, _ = settle(total[r, c], bound, scale, dtype)
    return 2 * int(done.sum()) >= spots.shape[0]


SMALLEST_NORMAL = 2.0**-126
INTEGER_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def settle(scaled_total: torch.Tensor, scaled_bound: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype):
    """(settled, value): where every real within bound of total rounds to one value of dtype.

    total and bound are in units of `scale` (a power of two, or None for 1); see the module's docstring.
    """
    total, bound = (scaled_total, scaled_bound) if scale is None else (scaled_total * scale, scaled_bound * scale)
    candidate = total.to(torch.float32).to(dtype)
    magnitude = candidate.abs()
    bits = magnitude.view(INTEGER_VIEW[dtype])
    below = (bits - 1).view(dtype).to(torch.float64)
    above = (bits + 1).view(dtype).to(torch.float64)
    overflow_point = torch.tensor(2.0 ** FORMATS[dtype].overflow_exponent, dtype=torch.float64, device=total.device)
    above = torch.where(torch.isinf(above), overflow_point, above)
    kept = magnitude.to(torch.float64)
    size = total.abs()
    inside = ((size - (kept + below) * 0.5) > bound) & (((kept + above) * 0.5 - size) > bound)  # halving exactly
    ordinary = inside & (magnitude != 0) & torch.isfinite(magnitude)
    exact = bound == 0
    exact_zero = exact & (total == 0)
    value = torch.where(exact_zero, torch.zeros((), dtype=dtype, device=total.device), candidate)
    if dtype == torch.float32:  # an exact total converts with one rounding (not so into bfloat16)
        ordinary |= exact & (magnitude >= SMALLEST_NORMAL) & torch.isfinite(magnitude)
    return ordinary | exact_zero, value
