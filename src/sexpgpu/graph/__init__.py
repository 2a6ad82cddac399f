"""The graph stage: checked forms -> typed, shaped IR -> the training graph.

    compile_program(experiment, field_specs=None) -> Program      (training.py)

ir.py holds nodes and graphs, ops.py the op table (shape and gradient rules), emit.py makes
nodes through it, build.py and layers.py evaluate graph bodies, autodiff.py differentiates,
optimizers.py builds the update graph.
"""

from sexpgpu.graph.frontend.build import Initializer, LoadSpec, ParamSpec
from sexpgpu.graph.core.ir import Graph, Node
from sexpgpu.graph.training.program import Program, TrainingGraph, compile_program, field_specs_of_generator

__all__ = [
    "Graph", "Initializer", "LoadSpec", "Node", "ParamSpec", "Program", "TrainingGraph",
    "compile_program", "field_specs_of_generator",
]
