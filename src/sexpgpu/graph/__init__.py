"""The graph stage: checked forms -> typed, shaped IR -> the training graph.

    compile_program(experiment, field_specs=None) -> Program      (training/program.py)

core/ is the IR (ir.py), the op table (ops.py), the emitter (emit.py) and the rule tables
backends register against ops (rules.py), with no language syntax; frontend/ evaluates graph
bodies (build.py, the built-in ops in layers.py, their records in records.py); passes/
rewrite graphs (precision, decompositions, diagnostics, the exact region); training/
differentiates (autodiff.py), builds the update (optimizers.py), stacks, and assembles the
Program. Each imports only those before it (tests/architecture/test_graph_packages.py).
"""

from sexpgpu.graph.frontend.records import Initializer, LoadSpec, ParamSpec
from sexpgpu.graph.core.ir import Graph, Node
from sexpgpu.graph.training.program import Program, TrainingGraph, compile_program, field_specs_of_generator

__all__ = [
    "Graph", "Initializer", "LoadSpec", "Node", "ParamSpec", "Program", "TrainingGraph",
    "compile_program", "field_specs_of_generator",
]
