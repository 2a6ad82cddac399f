"""Draw nodes: stateless samples from sexpgpu.numerics.

A draw node carries its run's seed and its stream path (attrs `seed`, `stream`); its inputs
are its salts, named by attrs `salts`. The key is `stream_key(seed, stream)`, and each salt
is folded in, in input order:
- a scalar salt (`step`, `microbatch`, or a scalar field) folds into the key:
  `key = fold_in(key, value)`;
- a salt with one integer per record (a record field) folds into one key per row: row r of
  the draw (its first axis, the batch) is drawn from `fold_in(key, value[r])` with the
  shape of one row. Later salts fold into every row's key.
A stacked draw (attr `repeats`, graph/training/stacking.py) is `repeats` copies, on its first axis, of
the draw of one microbatch's shape: element i has the index i mod (its size / repeats).
"""

from __future__ import annotations

import numpy as np

from sexpgpu import numerics as nx


def _sample(op: str, key, shape: tuple, attrs):
    return nx.draw(op, key, shape, **{name: attrs[name] for name in nx.DRAW_PARAMETERS[op]})


def draw(node, salts) -> np.ndarray:
    attrs = node.attrs
    keys = [nx.stream_key(attrs["seed"], attrs["stream"])]
    per_row = False
    for value in salts:
        value = np.asarray(value)
        if value.ndim == 0:
            keys = [nx.fold_in(key, int(value)) for key in keys]
            continue
        if not per_row:
            keys = keys * value.shape[0]
            per_row = True
        keys = [nx.fold_in(key, int(item)) for key, item in zip(keys, value.tolist())]
    shape = tuple(node.shape)
    repeats = attrs.get("repeats", 1)
    if repeats != 1:  # stacked microbatches each draw the unstacked draw's elements (graph/training/stacking.py)
        block = np.asarray(_sample(node.op, keys[0], (shape[0] // repeats,) + shape[1:], attrs))
        return np.concatenate([block] * repeats)
    if not per_row:
        return np.asarray(_sample(node.op, keys[0], shape, attrs))
    return np.stack([np.asarray(_sample(node.op, key, shape[1:], attrs)) for key in keys])
