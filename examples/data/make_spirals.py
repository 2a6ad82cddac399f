"""Writes examples/data/spirals.npz: three interleaved spirals, 1536 points, with noise.

The points come from sexpgpu's portable draws and float32 cos/sin, so this script makes the
same arrays on every machine."""

from pathlib import Path

import numpy as np

from sexpgpu import numerics as nx

SEED, POINTS_PER_CLASS, CLASSES = 11, 512, 3


def spirals() -> tuple[np.ndarray, np.ndarray]:
    radius = nx.uniform(nx.stream_key(SEED, "spirals/radius"), (CLASSES, POINTS_PER_CLASS), 0.05, 1.0)
    noise = nx.normal(nx.stream_key(SEED, "spirals/noise"), (CLASSES, POINTS_PER_CLASS, 2), 0.0, 0.04)
    turn = np.arange(CLASSES, dtype=np.float32)[:, None] * np.float32(2.0943951)  # 2 pi / 3
    angle = (radius * np.float32(4.0) + turn).astype(np.float32)
    x = np.stack([radius * nx.cos(angle), radius * nx.sin(angle)], axis=-1).astype(np.float32) + noise
    y = np.repeat(np.arange(CLASSES, dtype=np.int32), POINTS_PER_CLASS).reshape(CLASSES, POINTS_PER_CLASS)
    return x.reshape(-1, 2).astype(np.float32), y.reshape(-1)


if __name__ == "__main__":
    x, y = spirals()
    np.savez(Path(__file__).with_name("spirals.npz"), x=x, y=y)
    print(f"wrote {len(y)} records")
