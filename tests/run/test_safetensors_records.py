"""`(records "FILE.safetensors")`, as docs/language.md documents it: record files written by
the `safetensors` library train exactly as the same arrays in a .npz file do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from sexpgpu.cli.main import main
from sexpgpu.data.sources import RecordSource
from sexpgpu.errors import SexpgpuError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-adam.sexp"


def spirals(folder: Path) -> dict[str, np.ndarray]:
    with np.load(ROOT / "examples" / "data" / "spirals.npz") as archive:
        arrays = {name: archive[name] for name in archive.files}
    (folder / "data").mkdir()
    shutil.copy(ROOT / "examples" / "data" / "spirals.npz", folder / "data" / "spirals.npz")
    save_file(arrays, str(folder / "data" / "spirals.safetensors"))
    return arrays


def test_a_safetensors_record_file_reads_the_same_records_as_its_npz(tmp_path):
    arrays = spirals(tmp_path)
    from_safetensors = RecordSource(str(tmp_path / "data" / "spirals.safetensors"), shuffle=False, seed=0)
    from_npz = RecordSource(str(tmp_path / "data" / "spirals.npz"), shuffle=False, seed=0)
    assert from_safetensors.fields == from_npz.fields
    assert set(from_safetensors.fields) == set(arrays)
    for start in (0, len(arrays["y"]) - 3):
        ours, theirs = from_safetensors.batch(start, 7), from_npz.batch(start, 7)
        assert all(np.array_equal(ours[name], theirs[name]) for name in arrays)


def test_a_run_on_safetensors_records_repeats_the_npz_runs_bits(tmp_path, capsys):
    spirals(tmp_path)
    source = EXAMPLE.read_text().replace(":steps 200", ":steps 3")
    digests = {}
    for suffix in ("npz", "safetensors"):
        experiment = tmp_path / f"tiny-{suffix}.sexp"
        experiment.write_text(source.replace('"data/spirals.npz"', f'"data/spirals.{suffix}"'))
        run_dir = tmp_path / f"run-{suffix}"
        assert main(["run", str(experiment), "--device", "cpu", "--run-dir", str(run_dir)]) == 0, capsys.readouterr().err
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        digests[suffix] = [line.get("digest") for line in lines if "digest" in line]
    assert len(digests["npz"]) == 3 and digests["npz"] == digests["safetensors"]


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.zeros((3, 2), np.float64)}, "float64"),
    ({"x": np.zeros((3, 2), np.float32), "y": np.zeros(4, np.int32)}, "different numbers of records"),
])
def test_a_bad_safetensors_record_file_is_E_DATA_002(tmp_path, arrays, message):
    path = tmp_path / "bad.safetensors"
    save_file(arrays, str(path))
    with pytest.raises(SexpgpuError) as caught:
        RecordSource(str(path), shuffle=False, seed=0)
    assert caught.value.code == "E-DATA-002" and message in caught.value.message


def test_a_file_that_is_not_safetensors_is_E_DATA_002(tmp_path):
    path = tmp_path / "notes.safetensors"
    path.write_text("these are notes, not records\n")
    with pytest.raises(SexpgpuError) as caught:
        RecordSource(str(path), shuffle=False, seed=0)
    assert caught.value.code == "E-DATA-002" and "not a valid safetensors file" in caught.value.message
    assert "notes" not in caught.value.message.replace(str(path), "")
