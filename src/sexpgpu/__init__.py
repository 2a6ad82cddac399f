"""SexpGPU: reproducible neural-network training from S-expression experiment files.

A run travels one path, one package per stage:
file -> lang (reader, forms) -> graph (IR, autodiff, training graph) -> plan (memory)
-> backends (cpu interpreter, cuda) -> run (loop, report, metrics) -> store (checkpoints).
`numerics` and `exact` are leaf libraries used by every stage that computes.
"""

from sexpgpu.version import __version__
