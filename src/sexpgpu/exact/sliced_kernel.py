"""An implementation of `accumulate` on fp64 matrix products: operands cut into bit slices.

Every value is cut along fixed windows of WINDOW_BITS bits of absolute position (window t
holds the bits of weight 2**(-149 + t * WINDOW_BITS) up to the next window), so slice t of
every element is an integer below 2**WINDOW_BITS times the same power of two. The product of
two slice matrices is then a matrix of integer sums below K * 2**(2 * WINDOW_BITS), which is
exact in fp64 however the matrix product orders its additions, as long as K stays below
2**(53 - 2 * WINDOW_BITS). Each product matrix goes into the digits at one shift.

The work grows with the number of windows the operands' bits reach: few for values of
similar magnitude, many for operands spanning the whole exponent range. Being plain torch
operations, the same code runs on CPU (MKL) and CUDA (cuBLAS) tensors.
"""

from __future__ import annotations

import torch

from .layout import DIGITS, LOW_MASK, LOWEST_DIGIT_EXPONENT, LOWEST_INPUT_EXPONENT, RADIX_BITS, TOP, WIDTH

WINDOW_BITS = 21
K_PER_PRODUCT = 1 << (53 - 2 * WINDOW_BITS)


def accumulate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    planes = torch.zeros((WIDTH, x.shape[0], w.shape[0]), dtype=torch.int64, device=x.device)
    for k0 in range(0, x.shape[1], K_PER_PRODUCT):
        x_slices = slices(x[:, k0 : k0 + K_PER_PRODUCT])
        w_slices = slices(w[:, k0 : k0 + K_PER_PRODUCT])
        by_window_sum: dict[int, torch.Tensor] = {}
        for t, x_slice in x_slices.items():
            for u, w_slice in w_slices.items():
                exact_sums = (x_slice @ w_slice.T).to(torch.int64)
                previous = by_window_sum.get(t + u)
                by_window_sum[t + u] = exact_sums if previous is None else previous.add_(exact_sums)
        for window_sum, total in sorted(by_window_sum.items()):
            _add_at_bit(planes, total, window_sum * WINDOW_BITS + 2 * LOWEST_INPUT_EXPONENT - LOWEST_DIGIT_EXPONENT)
    # Sums of products near 2**256 reach one digit past the top: the first special plane
    # served as that digit. Fold it into the signed top digit; the special planes start at zero.
    planes[TOP] += planes[DIGITS] << RADIX_BITS
    planes[DIGITS:] = 0
    return planes


def slices(t: torch.Tensor) -> dict[int, torch.Tensor]:
    """{window: fp64 integers below 2**WINDOW_BITS}, only for windows holding some bit of t."""
    values = t.to(torch.float64)
    nonzero = values[values != 0]
    if nonzero.numel() == 0:
        return {}
    # Bit positions counted from 2**-149: the highest set bit, and a bound below the lowest.
    exponents = torch.frexp(nonzero).exponent.to(torch.int64) - 1 - LOWEST_INPUT_EXPONENT
    first = max(0, int(exponents.min()) - 23) // WINDOW_BITS
    last = int(exponents.max()) // WINDOW_BITS
    result = {}
    above = _bits_from(values, first)
    for window in range(first, last + 1):
        below, above = above, _bits_from(values, window + 1)
        piece = below - above * 2.0**WINDOW_BITS
        if bool(piece.any()):
            result[window] = piece
    return result


def _bits_from(values: torch.Tensor, window: int) -> torch.Tensor:
    """The bits of weight 2**(-149 + window * WINDOW_BITS) and above, as signed fp64 integers."""
    return torch.trunc(values * 2.0 ** (-LOWEST_INPUT_EXPONENT - window * WINDOW_BITS))


def _add_at_bit(planes: torch.Tensor, value: torch.Tensor, position: int) -> None:
    """planes += value * 2**position in digit units, for int64 |value| < 2**62 and position >= 0."""
    digit, shift = divmod(position, RADIX_BITS)
    low = (value & LOW_MASK) << shift  # below 2**63
    high = (value >> RADIX_BITS) << shift  # signed, below 2**61 in magnitude
    planes[digit] += low & LOW_MASK
    planes[digit + 1] += (low >> RADIX_BITS) + (high & LOW_MASK)
    planes[digit + 2] += high >> RADIX_BITS
