"""Dump every CUDA lowering decision for a set of graphs: launches, kernel sources, arena plan.

    PYTHONPATH=src:tests:tests/cuda python tests/cuda/dump_lowering.py OUT.txt
Compare two dumps with `diff`: a difference in kernel source could change speed; a
difference in arena offsets is allowed only if peak bytes (arena_bytes) do not grow.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    from sexpgpu.backends.cuda.codegen.compile import GeneratedKernel  # noqa: E402
except ImportError:  # before the rename of the launches (commit 02e5ae9)
    from sexpgpu.backends.cuda.codegen.compile import Launch as GeneratedKernel  # noqa: E402
from sexpgpu.backends.cuda.fusion import FusionPolicy  # noqa: E402
try:
    from sexpgpu.backends.cuda.lowering import lower  # noqa: E402
except ImportError:  # before the pipeline's stages (commit 087833e)
    from sexpgpu.backends.cuda.lowering import Lowerer  # noqa: E402

    def lower(graph, policy):
        return Lowerer(graph, policy).lower()
from sexpgpu.graph.training.program import compile_program  # noqa: E402
from sexpgpu.lang.forms import load_experiment  # noqa: E402
from sexpgpu.run.feed import Feeder  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402


def generated_kernels(obj, seen=None) -> list:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, GeneratedKernel):
        return [obj]
    built = next((getattr(obj, name) for name in ("kernels", "launches") if isinstance(getattr(type(obj), name, None), property)), None)
    if built is not None:  # a row kernel builds its kernels when first asked (`launches` before the rename)
        return [launch for item in built for launch in generated_kernels(item, seen)]
    if isinstance(obj, (list, tuple)):
        return [launch for item in obj for launch in generated_kernels(item, seen)]
    if isinstance(obj, dict):
        return [launch for item in obj.values() for launch in generated_kernels(item, seen)]
    if getattr(type(obj), "__module__", "").startswith("sexpgpu") and hasattr(obj, "__dict__"):
        return [launch for item in vars(obj).values() for launch in generated_kernels(item, seen)]
    if callable(obj) and getattr(obj, "__closure__", None):
        return [launch for cell in obj.__closure__ for launch in generated_kernels(cell.cell_contents, seen)]
    return []


def dump_lowered(name: str, lowered, out) -> None:
    out.write(f"=== {name}\n")
    out.write(f"inputs {sorted(lowered.inputs.items())}\noutputs {sorted(lowered.outputs.items())}\n")
    for key, buffer in lowered.buffers.items():
        out.write(f"buffer {key} {buffer.dtype} {buffer.shape} {buffer.kind} {buffer.live_from_start}\n")
    out.write(f"arena_bytes {lowered.arena_bytes}\noffsets {sorted(lowered.offsets.items())}\n")
    out.write(f"in_place {sorted(getattr(lowered, 'in_place', {}).items())}\n")
    for index, step in enumerate(lowered.launches if hasattr(lowered, "launches") else lowered.steps):
        extra = {field: getattr(step, field, None) for field in ("operands", "aliases", "product", "engine", "pattern")}
        out.write(f"step {index} {type(step).__name__} {step.kind} reads={step.reads} writes={step.writes} {extra}\n")
        for launch in generated_kernels(step):
            out.write(f"  launch {launch.name} grid={launch.grid} warps={launch.num_warps}\n{launch.source}\n")


def example_graphs():
    paths = sorted(f"examples/{name}" for name in os.listdir("examples") if name.endswith(".sexp")) + ["bench/gpt-50m.sexp"]
    for path in paths:
        for precision in ("f32", "bf16"):
            experiment = load_experiment(path)
            run = replace(experiment.run, precision=precision)
            experiment = replace(experiment, runs={**experiment.runs, run.name: run})
            program = compile_program(experiment, Feeder(run, Interpreter()).field_specs())
            yield f"{path} {precision} micro", program.training.micro
            yield f"{path} {precision} update", program.training.update
            for pass_name, graph in program.passes.items():
                yield f"{path} {precision} pass {pass_name}", graph


def random_graphs():
    from random_graphs import graph_from_seed

    for profile, count in (("tiny", 120), ("gpu", 40)):
        for seed in range(count):
            yield f"random {profile} {seed}", graph_from_seed(seed, profile).graph


def main() -> None:
    with open(sys.argv[1], "w") as out:
        for name, graph in list(example_graphs()) + list(random_graphs()):
            for level in ("on", "off"):
                dump_lowered(f"{name} {level}", lower(graph, FusionPolicy(level)), out)


if __name__ == "__main__":
    main()
