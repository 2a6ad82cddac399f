"""The diagnostics selection's statistics (docs/tools.md, "Diagnostics"): on a sampled step,
from the diagnosed graph's call on the first microbatch and the update, one metrics record of

- `diag/grad_norm/<param>`: the L2 norm of the first microbatch's gradient;
- `diag/update_ratio/<param>`: |new - old| / |old| of the update, L2 norms;
- `diag/act/<layer>/{mean,rms,max_abs,zero_fraction,nonfinite}`: the layer's activation.

Every figure is computed on the host in float64 with exactly rounded sums (math.fsum), so it
is the same on every machine for the same tensors. Means and norms are over finite elements;
`nonfinite` counts the others.
"""

from __future__ import annotations

import math

import numpy as np

from sexpgpu.graph.passes.diagnosed import ACTIVATION


def diagnosed_step(run, step: int) -> bool:
    spec = run.diagnostics
    return spec is not None and step % spec.every == 0


def statistics(step: int, grads: dict, activations: dict, before: dict, after: dict) -> dict:
    """The step's diag record: `grads` are "grad/<param>" host arrays of the first
    microbatch, `activations` "act/<layer>" ones, `before`/`after` the parameters."""
    record = {"step": step}
    for name in sorted(grads):
        record[f"diag/grad_norm/{name[len('grad/'):]}"] = _norm(grads[name])
    for path in sorted(before):
        scale = _norm(before[path])
        change = _norm(np.asarray(after[path], np.float64) - np.asarray(before[path], np.float64))
        record[f"diag/update_ratio/{path}"] = change / scale if scale > 0 else (0.0 if change == 0 else math.inf)
    for name in sorted(activations):
        layer = name[len(ACTIVATION):]
        for statistic, value in _activation(activations[name]).items():
            record[f"diag/act/{layer}/{statistic}"] = value
    return record


def _finite(values) -> np.ndarray:
    flat = np.asarray(values, dtype=np.float64).ravel()
    return flat[np.isfinite(flat)]


def _norm(values) -> float:
    finite = _finite(values)
    return math.sqrt(math.fsum((finite * finite).tolist()))


def _activation(values) -> dict:
    flat = np.asarray(values, dtype=np.float64).ravel()
    finite = flat[np.isfinite(flat)]
    count = max(1, finite.size)
    return {
        "mean": math.fsum(finite.tolist()) / count,
        "rms": math.sqrt(math.fsum((finite * finite).tolist()) / count),
        "max_abs": float(np.max(np.abs(finite))) if finite.size else 0.0,
        "zero_fraction": float(np.count_nonzero(flat == 0)) / max(1, flat.size),
        "nonfinite": int(flat.size - finite.size),
    }
