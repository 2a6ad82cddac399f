"""What `sexpgpu checkpoint PATH` prints: a checkpoint's record and its tensors' shapes.

Only experiment.json (checked against the commit marker) and the tensor files' headers are
read, so describing a large checkpoint on S3 downloads a few kilobytes.
"""

from __future__ import annotations

import json

from sexpgpu.store.checkpoints import MODEL_FILE, PARAM_PREFIX, read_record, recorded_pins, tensor_headers


def describe_checkpoint(path: str) -> dict:
    """A JSON-ready summary: step, experiment name and digest, selection, flags, choices,
    load pins, and each tensor's file, dtype and shape."""
    record = read_record(path)
    experiment = record.get("experiment") if isinstance(record.get("experiment"), dict) else {}
    tensors = []
    for file, header in tensor_headers(path, record).items():
        prefix = PARAM_PREFIX if file == MODEL_FILE else ""
        for name, entry in sorted(header.entries.items()):
            tensors.append({"name": prefix + name, "file": file, "dtype": entry.dtype, "shape": list(entry.shape)})
    return {
        "path": path,
        "step": record["step"],
        "experiment": {"name": experiment.get("name"), "digest": experiment.get("digest")},
        "selection": record.get("selection"),
        "flags": record.get("flags"),
        "choices": record.get("choices"),
        "loads": [pin.to_json() for pin in recorded_pins(path, record)],
        "files": record["tensors"],
        "tensors": tensors,
    }


def format_checkpoint(summary: dict) -> str:
    """The summary as aligned text for a terminal."""
    experiment = summary["experiment"]
    lines = [
        _row("checkpoint", summary["path"]),
        _row("step", summary["step"]),
        _row("experiment", f"{experiment.get('name') or '(unnamed)'}  {experiment.get('digest') or '(no digest)'}"),
        _row("selection", summary.get("selection") or "(none)"),
        _row("flags", _flags(summary.get("flags"))),
        _row("choices", "none recorded" if summary.get("choices") is None else json.dumps(summary["choices"], sort_keys=True)),
    ]
    loads = summary.get("loads") or []
    lines.append(_row("loads", f"{len(loads)}" if loads else "none"))
    lines += [f"  {pin.get('param')}  <-  {pin.get('file')}  tensor {pin.get('tensor')}, {pin.get('bytes')} bytes, "
              f"{pin.get('version_kind')} {pin.get('version')}" for pin in loads]
    lines.append(_row("tensors", f"{len(summary['tensors'])} in {len(summary['files'])} files"))
    width = max((len(t["name"]) for t in summary["tensors"]), default=0)
    lines += [f"  {t['name']:<{width}}  {t['dtype']:<4}  {t['shape']}  {t['file']}" for t in summary["tensors"]]
    return "\n".join(lines) + "\n"


def _row(label: str, value) -> str:
    return f"{label:<12}{value}"


def _flags(flags) -> str:
    if not flags:
        return "none"
    if isinstance(flags, dict):
        return " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(flags.items()))
    return " ".join(map(str, flags)) if isinstance(flags, list) else str(flags)
