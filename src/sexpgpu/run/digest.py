"""Digests of parameter bits: what lets two runs be compared bit for bit, step by step."""

from __future__ import annotations

import hashlib

import numpy as np


def tensor_digest(array: np.ndarray) -> str:
    contiguous = np.ascontiguousarray(array)
    digest = hashlib.sha256()
    digest.update(f"{contiguous.dtype.str}{contiguous.shape}".encode())
    digest.update(contiguous.tobytes())
    return digest.hexdigest()


def parameters_digest(params: dict[str, np.ndarray]) -> str:
    """One SHA-256 over every parameter in path order: path, dtype, shape, then the bytes."""
    digest = hashlib.sha256()
    for path in sorted(params):
        array = np.ascontiguousarray(params[path])
        digest.update(f"{path}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
