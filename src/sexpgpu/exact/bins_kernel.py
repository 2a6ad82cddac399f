"""The reference implementation of `accumulate`, on CPU: integer significands binned by exponent.

Every bf16 or f32 value is an integer significand s (|s| < 2**24) times 2**e. A product's
significand s_x * s_w is an exact int64 and its exponent e_x + e_w selects a bin. Products
that share a bin add as integers (fewer than 2**15 of them keep a bin below 2**63), and
each bin is then shifted into the radix-2**32 digits. No step rounds, so the order of the
additions cannot matter.
"""

from __future__ import annotations

import torch

from .layout import DIGITS, LOW_MASK, LOWEST_DIGIT_EXPONENT, RADIX_BITS, TOP, WIDTH

# A product's bin is s = e_x + e_w - LOWEST_DIGIT_EXPONENT, between 22 and 528; bins come in
# groups of 32, and a group's index is the digit that its bins' lowest bits fall in.
K_PER_BIN_PASS = 1 << 14  # products a bin may collect: 2**14 * 2**48 < 2**63
OUTPUTS_PER_TILE = 4096  # each with 32 int64 bins per digit its tile's products reach
PRODUCTS_PER_TILE = 1 << 21


def accumulate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    M, K = x.shape
    N = w.shape[0]
    planes = torch.zeros((WIDTH, M, N), dtype=torch.int64)
    x_sig, x_exp = split_floats(x)
    w_sig, w_exp = split_floats(w)
    tile_m, tile_n, tile_k = _tile_sizes(M, N, K)
    for m0 in range(0, M, tile_m):
        for n0 in range(0, N, tile_n):
            rows, cols = slice(m0, m0 + tile_m), slice(n0, n0 + tile_n)
            for k0 in range(0, K, tile_k):
                ks = slice(k0, k0 + tile_k)
                bins, first_group = _bin_products(x_sig[rows, ks], x_exp[rows, ks], w_sig[cols, ks], w_exp[cols, ks])
                planes[:DIGITS, rows, cols] += _bins_to_digits(bins, first_group)
    return planes


def split_floats(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed integer significands and the exponents of their lowest bits (int64, t's shape).

    The caller has replaced NaN and infinities by zero (they are counted apart).
    """
    bits = t.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    biased = (bits >> 23) & 0xFF
    fraction = bits & 0x7FFFFF
    normal = biased != 0
    significand = torch.where(normal, fraction | 0x800000, fraction)
    significand = torch.where(bits < 0, -significand, significand)
    exponent = torch.where(normal, biased - 150, -149)
    return significand, exponent


def _tile_sizes(M: int, N: int, K: int) -> tuple[int, int, int]:
    tile_n = max(1, min(N, OUTPUTS_PER_TILE))
    tile_m = max(1, min(M, OUTPUTS_PER_TILE // tile_n))
    tile_k = max(1, min(K, K_PER_BIN_PASS, PRODUCTS_PER_TILE // (tile_m * tile_n)))
    return tile_m, tile_n, tile_k


def _bin_products(x_sig, x_exp, w_sig, w_exp) -> tuple[torch.Tensor, int]:
    """Sum the products of one tile into (m, n, bin) integer bins.

    Only the groups of bins that the tile's non-zero products reach are made; the first
    one's index comes back with them. Which groups exist changes the work, not the sums.
    """
    m, n = x_sig.shape[0], w_sig.shape[0]
    products = x_sig[:, None, :] * w_sig[None, :, :]
    bin_index = x_exp[:, None, :] + w_exp[None, :, :] - LOWEST_DIGIT_EXPONENT
    reached = bin_index[products != 0]
    if reached.numel() == 0:
        return torch.zeros((m, n, 0), dtype=torch.int64), 0
    first_group = int(reached.min()) // RADIX_BITS
    groups = int(reached.max()) // RADIX_BITS - first_group + 1
    bins_per_output = groups * RADIX_BITS
    # Zero products add nothing wherever they go; keep their index inside the tile's bins.
    local = (bin_index - first_group * RADIX_BITS).clamp_(0, bins_per_output - 1)
    output_index = torch.arange(m * n, dtype=torch.int64).view(m, n, 1)
    bins = torch.zeros(m * n * bins_per_output, dtype=torch.int64)
    bins.index_add_(0, (output_index * bins_per_output + local).reshape(-1), products.reshape(-1))
    return bins.view(m, n, bins_per_output), first_group


def _bins_to_digits(bins: torch.Tensor, first_group: int) -> torch.Tensor:
    """(m, n, 32 * groups) bins, each |b| < 2**63, from digit `first_group` up -> (DIGITS, m, n) digits."""
    m, n = bins.shape[:2]
    grouped = bins.reshape(m * n, -1, RADIX_BITS)
    groups = grouped.shape[1]
    shift = torch.arange(RADIX_BITS, dtype=torch.int64)
    # Split each bin into a low half in [0, 2**32) and a signed high half, so that shifting
    # either by up to 31 bits stays inside int64; each shifted half spans two digits.
    low = (grouped & LOW_MASK) << shift
    high = (grouped >> RADIX_BITS) << shift
    digits = torch.zeros((m * n, DIGITS + 1), dtype=torch.int64)
    first = first_group
    digits[:, first : first + groups] += (low & LOW_MASK).sum(-1)
    digits[:, first + 1 : first + groups + 1] += (low >> RADIX_BITS).sum(-1) + (high & LOW_MASK).sum(-1)
    digits[:, first + 2 : first + groups + 2] += (high >> RADIX_BITS).sum(-1)
    # The top bins reach one digit past the top; fold it in (the top digit is signed).
    digits[:, TOP] += digits[:, DIGITS] << RADIX_BITS
    return digits[:, :DIGITS].t().reshape(DIGITS, m, n)
