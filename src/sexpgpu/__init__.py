"""SexpGPU: reproducible neural-network training from S-expression experiment files.

A run travels one path, one package per stage:
file -> lang (reader, forms) -> graph (IR, autodiff, training graph) -> plan (memory)
-> backends (cpu interpreter, cuda) -> run (loop, report, metrics) -> store (checkpoints).
`numerics` and `exact` are leaf libraries used by every stage that computes.

The Python API (docs/api.md): `train` an experiment file (`sexpgpu run`), `open_checkpoint`
as named numpy arrays or torch tensors, `compare` two runs (`sexpgpu diff`).
"""

from sexpgpu.api import RunResult, compare, open_checkpoint, train
from sexpgpu.version import __version__

__all__ = ["RunResult", "__version__", "compare", "open_checkpoint", "train"]
