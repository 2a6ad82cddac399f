"""Sample tensors and records for the store tests, a pure function of the step."""

from __future__ import annotations

import numpy as np


def sample_tensors(step: int, big_bytes: int = 0) -> dict[str, np.ndarray]:
    """Parameters, optimizer state and counters like a small run's; `big_bytes` adds a large
    float32 parameter, for multipart uploads and torn writes."""
    rng = np.random.default_rng(step)
    tensors = {
        "param/encoder/w": rng.standard_normal((8, 4), dtype=np.float32),
        "param/encoder/b": rng.standard_normal(4, dtype=np.float32),
        "param/head/w": (rng.standard_normal((4, 3), dtype=np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32),
        "state/m/encoder/w": rng.standard_normal((8, 4), dtype=np.float32),
        "state/v/encoder/w": rng.random((8, 4), dtype=np.float32),
        "state/count": np.array(step, dtype=np.int64),
        "data/order": rng.permutation(16).astype(np.int32),
        "flags/seen": rng.random(5) < 0.5,
    }
    if big_bytes:
        tensors["param/big"] = rng.standard_normal(big_bytes // 4, dtype=np.float32)
    return tensors


BF16 = ["param/head/w"]


def sample_record(step: int, name: str = "tiny") -> dict:
    return {
        "experiment": {"name": name, "digest": "sha256:" + "ab" * 32, "resolved": {"seed": 7, "batch": 4}},
        "selection": name,
        "flags": {"deterministic": True},
        "environment": {"SEXPGPU_PATTERNS": None},
        "world_size": 1,
        "device": "cpu",
        "data": {"position": step * 4},
        "microbatches": 2,
        "choices": None,
        "loads": [],
    }


def same_tensors(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)
