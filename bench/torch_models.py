"""The example models written in plain PyTorch: the peers the benchmarks measure against,
and the reference the GPU tests compare with."""

from __future__ import annotations

import math

import torch
from torch import nn


class MLP(nn.Module):
    """examples/tiny-adam.sexp: 2 -> 64 -> 64 -> 3 with ReLU."""

    def __init__(self, inputs=2, hidden=64, classes=3):
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(inputs, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Block(nn.Module):
    """`sdpa`: attention through F.scaled_dot_product_attention(is_causal=True), as a user
    writes it today (flash or memory-efficient kernels), instead of the written-out steps."""

    def __init__(self, width, heads, ff, sdpa=False):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(width, ff), nn.Linear(ff, width)

    def attention(self, x):
        batch, length, width = x.shape
        split = lambda t: t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
        q, k, v = split(self.wq(x)), split(self.wk(x)), split(self.wv(x))
        if self.sdpa:
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(batch, length, width))
        scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), 1)
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.wo(out.transpose(1, 2).reshape(batch, length, width))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class CharLM(nn.Module):
    """examples/char-lm.sexp: a causal transformer over bytes."""

    def __init__(self, vocab=256, context=64, width=64, heads=4, ff=256, layers=2, sdpa=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads, ff, sdpa) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x):
        h = self.embed(x) + self.positions[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.final_norm(h))


class CNN(nn.Module):
    """examples/cnn.sexp: two 3x3 convolutions with ReLU, a max-pool, an average pool and a head."""

    def __init__(self, width=8, wide=16, classes=2):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, wide, 3, padding=1)
        self.head = nn.Linear(wide, classes)

    def forward(self, x):
        h = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = nn.functional.adaptive_avg_pool2d(torch.relu(self.conv2(h)), 1)
        return self.head(h.flatten(1))
