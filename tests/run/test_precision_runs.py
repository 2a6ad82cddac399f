"""Whole runs in `:precision bf16` on the CPU interpreter: the loss falls and stays within an
envelope of the float32 run; the precision is recorded, and a resume checks it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from test_cli import EXAMPLES, sexpgpu

# bf16 products round each product to 8 bits of mantissa: the curves part, but each step's
# bf16 loss stays within ENVELOPE_STEP of the float32 loss (relative), and the mean of the
# last ten steps within ENVELOPE_TAIL (docs/language.md, "PRECISION").
ENVELOPE_STEP = 0.10
ENVELOPE_TAIL = 0.05


def tiny(tmp_path: Path, precision: str, steps: int = 60) -> Path:
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    text = text.replace(":steps 200", f":steps {steps} :precision {precision}")
    text = text.replace(":checkpoint 100", ":checkpoint 30")
    path = tmp_path / f"tiny-{precision}.sexp"
    path.write_text(text)
    return path


def small_char_lm(tmp_path: Path, precision: str) -> Path:
    """char-lm with one block over 16 bytes: its attention, layernorms and products, in seconds."""
    text = (EXAMPLES / "char-lm.sexp").read_text()
    text = text.replace(":model (char-lm x)", ":model (char-lm x :context 16 :layers 1 :width 32 :ff 64)")
    text = text.replace("(text pydoc :context 64)", "(text pydoc :context 16)")
    text = text.replace(":steps 200", f":steps 30 :precision {precision}")
    text = text.replace(":passes ((eval :every 50 :batches 2))", "")
    path = tmp_path / f"char-{precision}.sexp"
    path.write_text(text)
    return path


def run(file: Path, run_dir: Path, *extra) -> list[dict]:
    result = sexpgpu("run", str(file), "--device", "cpu", "--run-dir", str(run_dir), *extra)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(records: list[dict]) -> np.ndarray:
    return np.array([record["loss"] for record in records if "loss" in record and "step" in record])


def assert_in_envelope(bf16: np.ndarray, f32: np.ndarray) -> None:
    assert len(bf16) == len(f32)
    assert not np.array_equal(bf16, f32)  # the precision changed the arithmetic
    assert (np.abs(bf16 - f32) / np.abs(f32)).max() <= ENVELOPE_STEP
    assert abs(bf16[-10:].mean() - f32[-10:].mean()) / f32[-10:].mean() <= ENVELOPE_TAIL
    assert bf16[-10:].mean() < 0.8 * bf16[:5].mean()  # and it learns


def test_tiny_adam_in_bf16_learns_within_the_envelope_of_float32_and_records_its_precision(tmp_path):
    bf16 = run(tiny(tmp_path, "bf16"), tmp_path / "bf16")
    f32 = run(tiny(tmp_path, "f32"), tmp_path / "f32")
    assert_in_envelope(losses(bf16), losses(f32))
    recorded = json.loads((tmp_path / "bf16" / "experiment.json").read_text())
    assert recorded["experiment"]["run"]["precision"] == "bf16"


def test_char_lm_in_bf16_learns_within_the_envelope_of_float32(tmp_path):
    bf16 = losses(run(small_char_lm(tmp_path, "bf16"), tmp_path / "bf16"))
    f32 = losses(run(small_char_lm(tmp_path, "f32"), tmp_path / "f32"))
    assert_in_envelope(bf16, f32)


def test_a_bf16_resume_gives_the_uninterrupted_bits_and_a_float32_file_is_refused(tmp_path):
    file = tiny(tmp_path, "bf16")
    reference = run(file, tmp_path / "reference")
    resumed = run(file, tmp_path / "branch", "--resume", str(tmp_path / "reference" / "step-30"))
    after = [record for record in reference if record.get("step", 0) > 30]
    assert [record for record in resumed if record.get("step", 0) > 30] == after
    refused = sexpgpu("run", str(tiny(tmp_path, "f32")), "--device", "cpu", "--run-dir", str(tmp_path / "other"),
                      "--resume", str(tmp_path / "reference" / "step-30"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "E-CKPT-002" in refused.stderr and 'run.precision: checkpoint "bf16", now "f32"' in refused.stderr
