"""Attention for heads wider than the fused kernels take (codegen/attention.py,
MAX_FUSED_WIDTH: float32 64, bf16 128): the same formula, with the same operands,
statistics and rounding points, through PyTorch on 4-d (lead, heads, T, E) tensors. Every
sum is a cuBLAS float32 product (TF32 off) or a PyTorch reduction, none with atomics, so the
bits repeat; the scores are held in memory (lead x heads x TQ x TK floats), as the fused
kernels avoid. Since they are, D is formed from the probabilities and dO v^T when the
lowering passes none, the output being the forward's own (`_score_cotangent`).
"""

from __future__ import annotations


def _operand(x, bf16: bool):
    """A float32 value as a bf16 product's operand reads it: rounded to bf16 (and widened)."""
    return x.bfloat16().float() if bf16 else x


def _probabilities(q, k, lse, scale: float, causal: bool):
    """(softmax of s, lse) with s the masked scores; lse None: computed from s. The
    probabilities are exp(s - max) / sum, as the interpreter's, not exp(s - lse): lse's
    rounding, |lse| 2^-24, would enter every probability of the row, and wide heads' scores
    reach tens (the scores are in memory here, unlike in the fused kernels)."""
    import torch

    bf16 = q.dtype == torch.bfloat16
    scores = _operand(torch.matmul(q.float(), k.float().transpose(-1, -2)), bf16) * scale
    if causal:
        size = scores.shape[-1]
        mask = torch.ones((size, size), dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1) if lse is None else lse.view(scores.shape[:-1])
    return torch.softmax(scores, -1), lse


def forward(q, k, v, out, lse, scale: float, causal: bool) -> None:
    import torch

    probabilities, found = _probabilities(q, k, None, scale, causal)
    lse.view(found.shape).copy_(found)
    out.copy_(torch.matmul(_operand(probabilities, q.dtype == torch.bfloat16), v.float()))


def _score_cotangent(q, k, v, g, lse, delta, scale: float, causal: bool):
    """(P, dS) with dS = P (dO v^T - D). `delta` None: D = rowsum(P * dO v^T), which equals
    rowsum(dO * O) when O is the forward's output of these operands, and is formed from the
    very products it is subtracted from, so a row whose probability is all on one key (a
    single key, say) gets dS = 0 exactly instead of two sums' rounding apart, which its
    gradients multiply by the whole head's width."""
    import torch

    probabilities, _ = _probabilities(q, k, lse, scale, causal)
    products = torch.matmul(g.float(), v.float().transpose(-1, -2))
    if delta is None:
        delta = (probabilities * products).sum(-1, keepdim=True)
    else:
        delta = delta.view(products.shape[:-1]).unsqueeze(-1)
    return probabilities, probabilities * (products - delta)


def backward_kv(q, k, v, g, lse, delta, dk, dv, scale: float, causal: bool) -> None:
    import torch

    bf16 = q.dtype == torch.bfloat16
    probabilities, score_grad = _score_cotangent(q, k, v, g, lse, delta, scale, causal)
    dk.copy_(torch.matmul(_operand(score_grad, bf16).transpose(-1, -2), q.float()) * scale)
    dv.copy_(torch.matmul(_operand(probabilities, bf16).transpose(-1, -2), g.float()))


def backward_q(q, k, v, g, lse, delta, dq, scale: float, causal: bool) -> None:
    import torch

    _, score_grad = _score_cotangent(q, k, v, g, lse, delta, scale, causal)
    dq.copy_(torch.matmul(_operand(score_grad, q.dtype == torch.bfloat16), k.float()) * scale)
