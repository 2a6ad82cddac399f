"""The lowering report, printed before step 1 and kept in the run directory.

It ends with the spec's two closing lines: `determinism` (the run's level and why) and
`choices` (what the run chose from the machine)."""

from __future__ import annotations

import numpy as np

from sexpgpu.version import __version__


def _bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"


def row(label: str, text: str) -> str:
    """A line of the report, and of the tools' output: its label in a column of 20."""
    return f"  {label:<20}{text}"


def lowering_report(experiment, program, backend_facts: dict, memory: dict, source_identity: dict,
                    closing: list | None = None) -> str:
    """`closing`: (label, text) lines of the run's choices (run/choosing.py); without them the
    backend's own account closes the report, as for `sexpgpu check`."""
    run = experiment.run
    training = program.training
    param_values = sum(int(np.prod(spec.shape)) for spec in program.params.values())
    lines = [
        f"sexpgpu {__version__}: run {run.name} from {experiment.path} (sha256 {experiment.source_sha256[:16]})",
        row("backend", backend_facts["name"]),
        row("graph", f"{len(training.micro.nodes)} nodes a microbatch, {len(training.update.nodes)} in the update; "
                       f"{len(program.passes)} pass{'' if len(program.passes) == 1 else 'es'}"),
        row("parameters", f"{len(program.params)} tensors, {param_values:,} values"),
        row("memory plan", ", ".join(f"{name} peak {_bytes(peak)}" for name, peak in memory.items())),
        row("data", _describe_data(source_identity)),
        row("steps", f"{run.steps} steps of {run.microbatches} x {run.batch} records, "
                       f"{run.optimizer.kind}, {run.schedule.kind} schedule"),
    ]
    if run.diagnostics is not None:
        lines.append(row("diagnostics", f"every {run.diagnostics.every} steps the first microbatch runs the diagnosed "
                                          "graph (diag/* in metrics.jsonl): a diagnosed step's bits may differ from "
                                          "an undiagnosed run's, and a run with these diagnostics repeats its own"))
    closing = closing or [("determinism", backend_facts["determinism"]), ("choices", backend_facts["choices"])]
    lines += [row(label, text) for label, text in closing]
    return "\n".join(lines)


def _describe_data(identity: dict) -> str:
    kind = identity.get("kind")
    if kind == "records":
        return f"{identity['records']:,} records from {identity['path']} (sha256 {identity['sha256'][:16]})"
    if kind == "text":
        return (f"{identity['corpus']} corpus, {identity['bytes']:,} bytes, context {identity['context']} "
                f"(sha256 {identity['sha256'][:16]})")
    if kind == "generator":
        return f"generator {identity['name']}"
    return str(identity)

