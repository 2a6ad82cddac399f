"""An optimizer's update graph for the CUDA backend's tests of placement and in-place updates:
AdamW with clipping (or another optimizer) over parameters of given shapes, and inputs for it
on the host."""

from __future__ import annotations

import numpy as np

from sexpgpu.graph.frontend.records import Initializer, ParamSpec
from sexpgpu.graph.training.optimizers import build_update
from sexpgpu.lang.experiment import OptimizerSpec


ADAMW = OptimizerSpec("adamw", lr=0.1, weight_decay=0.01, clip=1.0)


def adamw_update(shapes: dict, seed: int = 3, optimizer: OptimizerSpec = ADAMW):
    """(the update graph, its inputs): random parameters, gradients and state (v at least 0),
    at step 2 with a learning rate of 0.05; AdamW with clipping unless `optimizer` says else."""
    params = {path: ParamSpec(path, shape, "f32", Initializer("zeros"), None) for path, shape in shapes.items()}
    graph, _ = build_update(params, optimizer, 1)
    rng = np.random.default_rng(seed)
    inputs = {name: rng.standard_normal(node.shape).astype(np.float32)
              for name, node in graph.inputs.items() if name not in ("step", "lr")}
    inputs.update({name: np.abs(value) for name, value in inputs.items() if name.startswith("state/v/")})
    return graph, {**inputs, "step": np.int32(2), "lr": np.float32(0.05)}


def swapped(pairs):
    """A change of a call's inputs: the values of each pair of names exchanged."""
    def change(given: dict) -> dict:
        return {**given, **{a: given[b] for a, b in pairs}, **{b: given[a] for a, b in pairs}}

    return change
