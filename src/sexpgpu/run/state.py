"""Everything a run carries from step to step: parameters, optimizer state and position.

This is exactly what a checkpoint holds, so a resume is a `TrainingState` read back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sexpgpu import numerics as nx


@dataclass
class TrainingState:
    step: int  # updates applied so far; the next step is step + 1
    params: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)  # "state/<slot>/<path>"

    def tensors(self) -> dict[str, np.ndarray]:
        """The checkpoint's tensors: "param/<path>" and "state/<slot>/<path>"."""
        named = {f"param/{path}": array for path, array in self.params.items()}
        named.update(self.optimizer)
        return named

    @classmethod
    def from_tensors(cls, step: int, tensors: dict[str, np.ndarray]) -> "TrainingState":
        params = {name[len("param/"):]: array for name, array in tensors.items() if name.startswith("param/")}
        optimizer = {name: array for name, array in tensors.items() if name.startswith("state/")}
        return cls(step, params, optimizer)

    def moved(self, move) -> "TrainingState":
        """The same state with every tensor passed through `move`: a backend's from_host or to_host."""
        return TrainingState(self.step, {path: move(value) for path, value in self.params.items()},
                             {name: move(value) for name, value in self.optimizer.items()})


def initial_value(spec, seed: int) -> np.ndarray:
    """A parameter's starting value: a draw keyed by the run's seed and the parameter's path."""
    key = nx.stream_key(seed, spec.path)
    init = spec.init
    return np.ascontiguousarray(nx.initialize(init.name, key, tuple(spec.shape), **dict(init.params)), dtype=np.float32)


def zero_optimizer_state(training) -> dict[str, np.ndarray]:
    return {name: np.zeros(shape, dtype=np.float32) for name, shape in training.state_shapes().items()}
