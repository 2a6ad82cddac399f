"""Whether a checkpoint belongs to the experiment that wants to resume from it.

Only what changes the bits counts. The run loop passes the checkpoint's experiment.json and
the record it would write now; `check_same_experiment` compares them at the `bit_keys`
(dotted paths into both records) and shows every difference.
"""

from __future__ import annotations

import json

from sexpgpu.errors import SexpgpuError

# The parts of a checkpoint record that change a run's bits when they change. The microbatch
# count and the data position are not here: the run loop checks the microbatch layout with
# its own error, and the data position is what a resume restores. Load pins are checked by
# verify_load_pin, and choices by the choices stage.
BIT_KEYS = (
    "experiment.resolved",  # the experiment as resolved: seed, data, model, loss, optimizer, schedule, sizes
    "selection",  # which defrun
    "flags",  # the command-line flags that change bits, e.g. --deterministic
    "environment",  # SEXPGPU_PATTERNS, SEXPGPU_OPTIMIZE, SEXPGPU_NODE_GRADIENTS
    "world_size",  # GPUs and nodes: each rank sums its own microbatches
    "device",  # the backend: the interpreter and CUDA sum in different orders
)


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()
_SHOWN = 12


def check_same_experiment(checkpoint_experiment: dict, current: dict, bit_keys=BIT_KEYS) -> None:
    """Raise E-CKPT-002 listing each difference at `bit_keys` between the two records."""
    differences = []
    for key in bit_keys:
        differences += _differences(key, _at(checkpoint_experiment, key), _at(current, key))
    if differences:
        shown = "; ".join(f"{path}: checkpoint {_show(old)}, now {_show(new)}" for path, old, new in differences[:_SHOWN])
        more = f"; and {len(differences) - _SHOWN} more" if len(differences) > _SHOWN else ""
        raise SexpgpuError("E-CKPT-002", f"the checkpoint was written by another experiment: {shown}{more}.",
                           hint="Resume with the file and flags that wrote it, or start a new run.")


def _at(record: dict, dotted: str):
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def _differences(path: str, old, new) -> list[tuple[str, object, object]]:
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new), key=str):
            found += _differences(f"{path}.{key}", old.get(key, _ABSENT), new.get(key, _ABSENT))
        return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        found = []
        for index, (a, b) in enumerate(zip(old, new)):
            found += _differences(f"{path}[{index}]", a, b)
        return found
    return [] if _same(old, new) else [(path, old, new)]


def _same(old, new) -> bool:
    if old is _ABSENT or new is _ABSENT:
        return old is new
    # Compare as written: the current record may hold a tuple where the one read back holds a list.
    return json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)


def _show(value) -> str:
    text = repr(value) if value is _ABSENT else json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
