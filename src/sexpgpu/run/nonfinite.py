"""What a run does when a step's loss is NaN or infinite (SEXPGPU_NONFINITE; docs/settings.md).

Under `stop`, the default, the run loop reads a step's microbatch losses before its update
(on a GPU, one wait a step); when one is not finite, the run stops with E-NUM-001 before
that update, so nothing of the step is logged or checkpointed. To say where it went wrong,
the first microbatch whose loss is not finite runs once more, on the same backend and
unstacked, as the traced graph (graph/passes/diagnosed.py: its forward part with every value kept),
and the message names the first value that holds a NaN or an infinity, in graph order: a
parameter or record field among the step's inputs, else a node with its place in the file.

A checkpoint holds only finite parameters and optimizer state: a step whose update made
one of them not finite stops the run, under `stop`, at that step's checkpoint, with the same
code; so the last checkpoint written stays the last good one, and the message names it.

Under `continue` the run goes on and reads nothing early. Neither changes a bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sexpgpu import settings
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.passes.diagnosed import TRACED, traced_graph
from sexpgpu.graph.core.ir import FLOAT_DTYPES, described, input_described, typed

# what made a step's input not finite, by the input's prefix
INPUT_CAUSES = {
    "param/": lambda step: f"step {step - 1}'s update made it so" if step > 1 else "its starting value holds it",
    "field/": lambda step: "the microbatch's data holds it",
}


@dataclass(frozen=True)
class NonFiniteStop:
    """SEXPGPU_NONFINITE=stop for a run whose checkpoints go to `root`."""

    root: str

    def loss_error(self, step: int, microbatch: int, loss, found: str) -> SexpgpuError:
        logged = f"the metrics log ends with step {step - 1}" if step > 1 else "the metrics log holds no step"
        return SexpgpuError("E-NUM-001", f"step {step}'s loss is not finite ({float(loss)}, microbatch {microbatch}): "
                                         f"{found}. The run stopped before its update, so the parameters are those "
                                         f"after step {step - 1}, and {logged}.", hint=self.advice(step))

    def check_checkpoint(self, step: int, tensors: dict) -> None:
        """E-NUM-001 when a tensor of step `step`'s checkpoint (host arrays by checkpoint name)
        holds a NaN or an infinity: the checkpoint is not written."""
        for name, array in tensors.items():
            bad = _nonfinite_count(array)
            if bad:
                raise SexpgpuError("E-NUM-001", f"after step {step} {input_described(name)} is not finite ({bad:,} of "
                                                f"{np.size(array):,} values NaN or infinite): step {step}'s update made "
                                                f"it so, and no checkpoint of step {step} was written.",
                                   hint=self.advice(step))

    def advice(self, step: int) -> str:
        """Where the run can go on from: the last checkpoint before `step`."""
        from sexpgpu.store import list_checkpoints

        change = ("Lower :lr or add :clip in the file, or set SEXPGPU_NONFINITE=continue to go on past it "
                  "(docs/settings.md).")
        try:
            earlier = [(done, where) for done, where in list_checkpoints(self.root) if done < step]
        except SexpgpuError:  # the destination cannot be listed now (S3 unreachable): the stop says so
            return f"The checkpoints under {self.root} cannot be listed now. {change}"
        if not earlier:
            return f"No checkpoint was written. {change}"
        done, where = earlier[-1]
        return (f"The last good checkpoint is {where} (step {done}); a resume from it (--resume {where}) repeats "
                f"these steps with the same bits. {change}")


def nonfinite_stop(root: str) -> NonFiniteStop | None:
    """The run's stop at a loss that is not finite, or None under SEXPGPU_NONFINITE=continue."""
    return NonFiniteStop(root) if settings.resolved("SEXPGPU_NONFINITE") == "stop" else None


def first_nonfinite(values) -> int | None:
    """The index of the first value that is NaN or infinite, or None."""
    return next((index for index, value in enumerate(values) if not np.isfinite(value)), None)


def first_nonfinite_value(backend, micro, inputs: dict, step: int) -> str:
    """What a message says of the first value of the microbatch graph `micro`, in graph order,
    that holds a NaN or an infinity, on these inputs: an input, else a node of the traced graph."""
    for name, node in micro.inputs.items():
        bad = _nonfinite_count(backend.to_host(inputs[name])) if node.dtype in FLOAT_DTYPES else 0
        if bad:
            cause = next((cause(step) for prefix, cause in INPUT_CAUSES.items() if name.startswith(prefix)), "")
            return f"{_first(node, name, bad)}, an input of the step: {cause}"
    try:
        outputs = backend.run(traced_graph(micro), inputs)
    except (MemoryError, SexpgpuError) as error:
        if not isinstance(error, MemoryError) and error.code != "E-MEM-001":
            raise
        return "the microbatch could not run again with every value kept, to find the first that is not (no memory)"
    for name, value in outputs.items():
        bad = _nonfinite_count(backend.to_host(value))
        if bad:
            return _first(micro.nodes[int(name[len(TRACED):])], None, bad)
    return ("run again alone with every value kept, the microbatch gave finite values (a stacked call sums in "
            "another order)")


def _first(node, input_name: str | None, bad: int) -> str:
    return (f"the first value that is not finite, in graph order, is {described(node, input_name)} ({typed(node)}: "
            f"{bad:,} of {node.size:,} values NaN or infinite)")


def _nonfinite_count(array) -> int:
    array = np.asarray(array)
    return int(array.size - np.count_nonzero(np.isfinite(array))) if array.dtype.kind == "f" else 0
