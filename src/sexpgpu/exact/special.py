"""NaN and infinite products, counted apart from the digits.

A product is NaN when either factor is NaN or one is infinite and the other zero; it is
infinite, with the sign of the factors' product, when one factor is infinite and the
other non-zero. The counts per output are products of 0/1 matrices in fp64: every partial
sum is an integer below 2**53, so they are exact in any summation order.
"""

from __future__ import annotations

import torch


def split_special(x: torch.Tensor, w: torch.Tensor):
    """(x, w with non-finite elements zeroed, (3, M, N) counts of NaN/+inf/-inf products or None)."""
    if bool(all_finite(x) & all_finite(w)):  # one synchronisation
        return x, w, None
    counts = torch.stack(_special_counts(_classes(x), _classes(w))).to(torch.int64)
    return _zero_nonfinite(x), _zero_nonfinite(w), counts


def all_finite(t: torch.Tensor) -> torch.Tensor:
    """Whether every element is finite, as a device boolean: one reduction that reads t once
    (its smallest and largest element, NaN propagating), where isfinite(t).all() writes a mask."""
    if t.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=t.device)
    lowest, highest = torch.aminmax(t)
    return torch.isfinite(lowest) & torch.isfinite(highest)


def _classes(t: torch.Tensor) -> dict[str, torch.Tensor]:
    finite = torch.isfinite(t)
    masks = {
        "nan": torch.isnan(t),
        "+inf": t == float("inf"),
        "-inf": t == float("-inf"),
        "zero": t == 0,
        "+": finite & (t > 0),
        "-": finite & (t < 0),
    }
    return {name: mask.to(torch.float64) for name, mask in masks.items()}


def _special_counts(a: dict, b: dict):
    def pairs(name_a, name_b):
        return a[name_a] @ b[name_b].T

    a_inf, b_inf = a["+inf"] + a["-inf"], b["+inf"] + b["-inf"]
    nan = (
        a["nan"].sum(1, keepdim=True)
        + (1 - a["nan"]) @ b["nan"].T
        + a_inf @ b["zero"].T
        + a["zero"] @ b_inf.T
    )
    b_up, b_down = b["+"] + b["+inf"], b["-"] + b["-inf"]
    pos_inf = a["+inf"] @ b_up.T + a["-inf"] @ b_down.T + pairs("+", "+inf") + pairs("-", "-inf")
    neg_inf = a["+inf"] @ b_down.T + a["-inf"] @ b_up.T + pairs("+", "-inf") + pairs("-", "+inf")
    return nan, pos_inf, neg_inf


def _zero_nonfinite(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(t), t, torch.zeros((), dtype=t.dtype, device=t.device))
