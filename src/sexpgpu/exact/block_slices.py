"""Implementations of `accumulate` on integer matrix products of slices under shared exponents.

For each block of K (`SliceProducts.k_block` columns) every row of x and every row of w
(a column of w.T) gets one exponent B, the bottom of a grid of slices: the row's values are
integers times 2**B, cut into S slices of `slice_bits` bits each, slice t holding the bits of
weight 2**(B + t * slice_bits) up to the next slice, with the element's sign. S is the
number of slices the block's widest row needs (from its highest bit down to its lowest
set bit), so every bit of every element lies in some slice: nothing is ever dropped.

    x[m, k] = sum_t X_t[m, k] * 2**(Bx[m] + t * W)        (W = slice_bits)
    x @ w.T = sum_{t, u} (X_t @ W_u.T) * 2**(Bx[m] + Bw[n] + (t + u) * W)

Each slice-pair product X_t @ W_u.T is a matrix of integer sums that the chosen matrix
product computes exactly (int8 tensor cores accumulate in int32; fp64 sums of integers
below 2**53 are exact in any order). Products with the same t + u share a weight and add
as int64; neighbouring sums are packed into int64 terms while they cannot overflow, and
each term goes into the radix-2**32 digits at its per-output bit position. No step rounds.

The residual: values of similar magnitude need the minimal number of slices (bf16: 2 of
7 bits, f32: 4); a block holding an element further below its row's top needs more
slices, for every row of that operand in that block. That costs time, never bits.

One piece of code does the arithmetic for every matrix product: on CUDA, int8 tensor
cores through cuBLASLt (`torch._int_mm`); on CPU, the same int8 slices multiplied in
fp64 (the reference the tests check bit for bit), and wider 20-bit slices in fp64 BLAS,
the fast exact CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .bins_kernel import split_floats
from .layout import DIGITS, LOW_MASK, LOWEST_DIGIT_EXPONENT, LOWEST_INPUT_EXPONENT, RADIX_BITS, TOP, WIDTH

TERM_BITS = 62  # a packed term stays below 2**62, so its shifted halves stay inside int64


@dataclass(frozen=True)
class SliceProducts:
    """How slices are cut and multiplied: one matrix product, exact for these widths and K."""

    slice_bits: int
    k_block: int  # columns sharing one exponent per row; bounds every product's sums
    slice_dtype: torch.dtype
    multiply: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (m, k), (n, k) -> exact (m, n) integers
    exact_bits: int  # the product is exact while every |sum| stays below 2**exact_bits

    def __post_init__(self):
        if self.sum_bound_bits() > self.exact_bits:
            raise ValueError(
                f"slices of {self.slice_bits} bits over blocks of {self.k_block} give sums of "
                f"{self.sum_bound_bits()} bits; this product is exact below 2**{self.exact_bits} only"
            )

    def sum_bound_bits(self) -> int:
        """Bits of the largest |entry| of one slice-pair product over a full block."""
        return (self.k_block * ((1 << self.slice_bits) - 1) ** 2).bit_length()


def fp64_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T in fp64: exact when every partial sum is an integer below 2**53."""
    return (a.to(torch.float64) @ b.to(torch.float64).T).to(torch.int64)


def int8_tensor_core_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T for int8 a (m, k) and b (n, k), int32 sums on cuBLASLt's int8 tensor cores.

    `torch._int_mm` wants more than 16 rows and K and N in multiples of 8: pad with zeros,
    which add nothing, and cut the result back. Multiples of 16 keep every row 16-byte aligned.
    """
    m, k = a.shape
    n = b.shape[0]
    padded_m, padded_k, padded_n = max(round_up(m, 16), 32), round_up(k, 16), round_up(n, 16)
    a = F.pad(a, (0, padded_k - k, 0, padded_m - m))
    b = F.pad(b, (0, padded_k - k, 0, padded_n - n))
    return torch._int_mm(a, b.T)[:m, :n]


def int8_reference_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The int8 tensor cores' results computed on CPU: int8 sums below 2**31 are exact in fp64."""
    return fp64_products(a, b).to(torch.int32)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# int32 holds k_block * 127**2 < 2**31 for k_block <= 2**17; 2**14 keeps the rows' spread small.
INT8_TENSOR_CORES = SliceProducts(7, 1 << 14, torch.int8, int8_tensor_core_products, exact_bits=31)
INT8_ON_CPU = SliceProducts(7, 1 << 14, torch.int8, int8_reference_products, exact_bits=31)
# fp64 holds 2**12 * (2**20 - 1)**2 < 2**53: an f32 of moderate spread needs 2 slices.
FP64_WIDE = SliceProducts(20, 1 << 12, torch.float64, fp64_products, exact_bits=53)


def accumulate_int8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`accumulate` on int8 slices: tensor cores on CUDA, the exact fp64 stand-in on CPU."""
    return accumulate_with(INT8_TENSOR_CORES if x.is_cuda else INT8_ON_CPU, x, w)


def accumulate_fp64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`accumulate` on 20-bit slices multiplied in fp64 (BLAS on CPU, cuBLAS DGEMM on CUDA)."""
    return accumulate_with(FP64_WIDE, x, w)


def accumulate_with(products: SliceProducts, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    planes = torch.zeros((WIDTH, x.shape[0], w.shape[0]), dtype=torch.int64, device=x.device)
    x_sig, x_exp = split_floats(x)
    w_sig, w_exp = split_floats(w)
    for k0 in range(0, x.shape[1], products.k_block):
        ks = slice(k0, k0 + products.k_block)
        x_slices = cut_slices(x_sig[:, ks], x_exp[:, ks], products)
        w_slices = cut_slices(w_sig[:, ks], w_exp[:, ks], products)
        if x_slices.pieces and w_slices.pieces:
            _add_block(planes, x_slices, w_slices, products)
    # A term's top part may reach the planes above the digits; modulo 2**64 they fold into
    # the signed top digit exactly (their weights 2**256 and up vanish there), then clear.
    planes[TOP] += planes[DIGITS] << RADIX_BITS
    planes[DIGITS:] = 0
    return planes


@dataclass(frozen=True)
class Slices:
    """One operand's block: {t: slice t as (rows, k) integers}, only non-zero ones, and each row's 2**bottom."""

    pieces: dict[int, torch.Tensor]
    bottom: torch.Tensor  # int64 (rows,): slice t of row r has weight 2**(bottom[r] + t * slice_bits)


def cut_slices(significand: torch.Tensor, exponent: torch.Tensor, products: SliceProducts) -> Slices:
    width = products.slice_bits
    magnitude = significand.abs()
    nonzero = magnitude != 0
    # An element is odd * 2**lowest; its bits span [lowest, top).
    lowest_one = magnitude & -magnitude
    trailing = _bit_length(lowest_one) - 1
    odd = magnitude >> trailing.clamp(min=0)
    lowest = exponent + trailing
    top = exponent + _bit_length(magnitude)
    row_top = torch.where(nonzero, top, LOWEST_INPUT_EXPONENT).amax(1)
    row_lowest = torch.where(nonzero, lowest, row_top[:, None]).amin(1)
    count = int(((row_top - row_lowest + width - 1) // width).max()) if significand.numel() else 0
    # The grid's bottom: low enough for the row's top to fit under count slices, never
    # below 2**-149 (no bit lies there), which keeps every position inside the digits.
    bottom = (row_top - width * count).clamp(min=LOWEST_INPUT_EXPONENT)
    shift = lowest - bottom[:, None]  # >= 0 for every non-zero element
    negative = significand < 0
    pieces = {}
    for t in range(count):
        up = shift - width * t  # where the element's lowest bit lands relative to slice t
        bits = torch.where(up >= 0, odd << up.clamp(0, width), odd >> (-up).clamp(0, 40)) & ((1 << width) - 1)
        if bool(bits.any()):
            pieces[t] = torch.where(negative, -bits, bits).to(products.slice_dtype)
    return Slices(pieces, bottom)


def _bit_length(values: torch.Tensor) -> torch.Tensor:
    """Bit length of non-negative int64 values below 2**53 (0 for 0)."""
    return torch.frexp(values.to(torch.float64)).exponent.to(torch.int64)


def _add_block(planes: torch.Tensor, xs: Slices, ws: Slices, products: SliceProducts) -> None:
    rows, cols = xs.bottom.shape[0], ws.bottom.shape[0]
    w_index = sorted(ws.pieces)
    w_stack = torch.cat([ws.pieces[u] for u in w_index])  # one product per slice of x
    base = xs.bottom[:, None] + ws.bottom[None, :] - LOWEST_DIGIT_EXPONENT
    bound_bits = products.sum_bound_bits() + min(len(xs.pieces), len(w_index)).bit_length()
    sums: dict[int, torch.Tensor] = {}  # t + u -> int64 sums of the products of that weight
    x_index = sorted(xs.pieces)
    for position, t in enumerate(x_index):
        by_w_slice = products.multiply(xs.pieces[t], w_stack).reshape(rows, len(w_index), cols)
        for column, u in enumerate(w_index):
            if t + u in sums:
                sums[t + u] += by_w_slice[:, column]
            else:
                sums[t + u] = by_w_slice[:, column].to(torch.int64)
        # Weights below the next x slice's lowest reach are complete: add them once they
        # fill a packed term, so that only about one row of sums is alive at a time.
        following = x_index[position + 1] if position + 1 < len(x_index) else None
        complete = [e for e in sorted(sums) if following is None or e < following + w_index[0]]
        if following is None or len(complete) >= _weights_per_term(products.slice_bits, bound_bits):
            ready = {e: sums.pop(e) for e in complete}
            for first, term in _packed_terms(ready, products.slice_bits, bound_bits):
                add_at_positions(planes, term, base + first * products.slice_bits)


def _packed_terms(sums: dict[int, torch.Tensor], width: int, bound_bits: int):
    """Pack sums of consecutive weights into (first weight, int64 term below 2**62) pairs.

    A term holds sums[first + i] * 2**(width * i) for i < per_term, chosen so that the
    bound of every sum (2**bound_bits) keeps the term below 2**TERM_BITS.
    """
    per_term = _weights_per_term(width, bound_bits)
    weights = sorted(sums)
    while weights:
        first = weights[0]
        group = [s for s in weights if s < first + per_term]
        weights = weights[len(group):]
        term = sums[group[-1]]
        for previous, current in zip(reversed(group[:-1]), reversed(group)):
            term = (term << (width * (current - previous))) + sums[previous]
        yield first, term


def _weights_per_term(width: int, bound_bits: int) -> int:
    if bound_bits >= TERM_BITS:
        raise ValueError(f"slice sums of {bound_bits} bits do not fit an int64 term")
    return (TERM_BITS - 1 - bound_bits) // width + 1


def add_at_positions(planes: torch.Tensor, value: torch.Tensor, position: torch.Tensor) -> None:
    """planes += value * 2**position, per output, for int64 |value| < 2**62 and 0 <= position.

    Each output's value spans three digits from position // 32; outputs are grouped by
    that digit, which takes few values when the rows' exponents are alike.
    """
    digit, shift = position >> 5, position & (RADIX_BITS - 1)
    low = (value & LOW_MASK) << shift  # below 2**63
    high = (value >> RADIX_BITS) << shift  # signed, below 2**61 in magnitude
    parts = (low & LOW_MASK, (low >> RADIX_BITS) + (high & LOW_MASK), high >> RADIX_BITS)
    first, last = int(digit.min()), int(digit.max())
    for d in range(first, last + 1):
        chosen = None if first == last else digit == d
        for offset, part in enumerate(parts):
            planes[d + offset] += part if chosen is None else torch.where(chosen, part, 0)
