"""The run loop at a stacking degree: tiny-adam stacked and unstacked, and the way back to
unstacked steps after a stacked call cannot allocate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sexpgpu.backends.cpu import Interpreter
from sexpgpu.errors import SexpgpuError
from sexpgpu.lang.forms import parse_experiment, select_run
from sexpgpu.lang.reader import read_text
from sexpgpu.run.choosing import stacked_training
from sexpgpu.run.loop import Stacking, Trainer
from sexpgpu.run.setup import build_run

TINY_ADAM = Path(__file__).resolve().parents[2] / "examples" / "tiny-adam.sexp"
STEPS = 24


def _tiny_adam():
    """tiny-adam with its 64 records a step as 4 microbatches of 16."""
    text = TINY_ADAM.read_text().replace(":batch 64", ":batch 16 :microbatches 4")
    return select_run(parse_experiment(read_text(text, str(TINY_ADAM)), str(TINY_ADAM), ""), None)


def _steps(degree: int, backend=None, on_unstacked=None, steps: int = STEPS, pinned: bool = False) -> tuple:
    experiment = _tiny_adam()
    built = build_run(experiment, "cpu")
    backend = backend or built.backend
    built.feeder.backend = backend
    stacking = Stacking(stacked_training(built.program, degree), degree, pinned)
    trainer = Trainer(experiment.run, built.program, backend, built.feeder, stacking, on_unstacked)
    state = built.initial_state()
    return [trainer.step(state) for _ in range(steps)], trainer


def test_tiny_adam_stacked_4_against_unstacked_agrees_early_and_drifts_by_rounding():
    unstacked, _ = _steps(1)
    stacked, _ = _steps(4)
    first_loss = next((a["step"] for a, b in zip(unstacked, stacked) if a["loss_bits"] != b["loss_bits"]), None)
    first_digest = next(a["step"] for a, b in zip(unstacked, stacked) if a["digest"] != b["digest"])
    gaps = [abs(a["loss"] - b["loss"]) for a, b in zip(unstacked, stacked)]
    print(f"\ntiny-adam, :microbatches 4: stacking 4 against 1: parameters first differ after step {first_digest}, "
          f"the step loss first differs at step {first_loss}; largest loss gap to step {STEPS}: {max(gaps):.2e}; "
          f"loss at step {STEPS}: {unstacked[-1]['loss']:.7f} against {stacked[-1]['loss']:.7f}")
    # step 1 runs the same parameters on the same records: every microbatch loss is the
    # unstacked one bit for bit, so their mean is too; the gradients sum in another order
    assert unstacked[0]["loss_bits"] == stacked[0]["loss_bits"]
    assert first_loss is not None and first_loss > 1
    assert max(gaps) < 1e-5


class _NoRoomForStacked(Interpreter):
    """A device with room for one microbatch a call: a call with more records fails to
    allocate, as the CUDA backend reports it (E-MEM-001)."""

    def __init__(self, batch: int):
        super().__init__()
        self.batch = batch
        self.failures = 0

    def run(self, graph, inputs: dict, lent: bool = False) -> dict:
        field = inputs.get("field/x")
        if field is not None and np.shape(field)[0] > self.batch:
            self.failures += 1
            raise SexpgpuError("E-MEM-001", "memory: allocation failed: the memory plan's arena needs 1,000 bytes")
        return super().run(graph, inputs)


def test_an_allocation_failure_in_a_stacked_call_continues_unstacked_with_the_unstacked_bits():
    unstacked, _ = _steps(1, steps=3)
    told = []
    device = _NoRoomForStacked(16)
    records, trainer = _steps(4, device, told.append, steps=3)
    assert told == [1] and device.failures == 1 and trainer.stacking.degree == 1
    assert [r["digest"] for r in records] == [r["digest"] for r in unstacked]


def test_an_allocation_failure_stops_a_pinned_run():
    with pytest.raises(SexpgpuError) as raised:
        _steps(2, _NoRoomForStacked(16), steps=1, pinned=True)
    assert raised.value.code == "E-MEM-001"
