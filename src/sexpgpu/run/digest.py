"""The digest of a step's parameters: what lets two runs be compared bit for bit, step by
step, without bringing the parameters to the host.

SHA-256 over every parameter in path order: its path, its shape, and its 64-bit fingerprint
(backends/cpu/fingerprint.py), which the backend computes where the parameter lives. Equal
parameter bits give equal digests on every backend; any changed bit changes the digest
(but for a chance of 2^-64).
"""

from __future__ import annotations

import hashlib


def parameters_digest(backend, params: dict) -> str:
    paths = sorted(params)
    fingerprints = backend.fingerprints([params[path] for path in paths])
    digest = hashlib.sha256()
    for path, fingerprint in zip(paths, fingerprints):
        shape = tuple(int(size) for size in params[path].shape)
        digest.update(f"{path}\0{shape}\0{fingerprint:016x}\0".encode())
    return digest.hexdigest()
