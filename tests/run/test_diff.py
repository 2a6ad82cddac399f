"""`sexpgpu diff` through `main()`: identical runs exit 0; a planted one-ulp difference in a
checkpoint is found at its step and its parameter, sized exactly (numpy's nextafter is the
oracle); records that differ are listed; bad input exits 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sexpgpu.store import read_checkpoint, write_checkpoint

from test_choosing import home, sexpgpu, tiny  # noqa: F401  (fixtures)

PLANTED = "param/fc2/w"


def plant_one_ulp(source: Path, dest: Path, step: int) -> tuple:
    """A copy of the run `source` whose checkpoint at `step` has one element one ulp up,
    written as a sound checkpoint; returns the ulp and the element's value. Its later steps are not there yet."""
    shutil.copytree(source, dest)
    for later in dest.glob("step-*"):
        shutil.rmtree(later)
    checkpoint = read_checkpoint(str(source / f"step-{step}"))
    name = PLANTED
    tensors = dict(checkpoint.tensors)
    # the largest element: the updates after it are far below its ulp's scale, so its difference lives on
    index = np.unravel_index(np.argmax(np.abs(tensors[name])), tensors[name].shape)
    tensors[name] = tensors[name].copy()
    before = tensors[name][index]
    tensors[name][index] = np.nextafter(before, np.float32(np.inf))
    record = {key: value for key, value in checkpoint.experiment.items() if key not in ("format", "step", "tensors")}
    write_checkpoint(str(dest), step, tensors, record)
    return float(np.float64(tensors[name][index]) - np.float64(before)), float(before)


@pytest.fixture
def run_a(sexpgpu, tiny, tmp_path) -> Path:
    code, _, err = sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "a")
    assert code == 0, err
    return tmp_path / "a"


def test_identical_runs_exit_0(sexpgpu, tiny, run_a, tmp_path):
    sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "b")
    code, out, _ = sexpgpu("diff", run_a, tmp_path / "b")
    assert code == 0 and "identical (exit 0)" in out
    code, out, _ = sexpgpu("diff", run_a / "metrics.jsonl", tmp_path / "b/metrics.jsonl", "--json")
    assert code == 0 and json.loads(out)["identical"] is True


def test_a_planted_one_ulp_difference_is_found_at_its_step_and_parameter(sexpgpu, tiny, run_a, tmp_path):
    ulp, before = plant_one_ulp(run_a, tmp_path / "b", 3)
    code, _, err = sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "b", "--resume", "latest")
    assert code == 0, err
    code, out, _ = sexpgpu("diff", run_a, tmp_path / "b", "--json")
    found = json.loads(out)
    assert code == 1 and found["identical"] is False
    assert found["first_step"] == 4 and "digest" in found["first_step_parts"]
    assert found["checkpoint_step"] == 3 and found["records"] == []
    (tensor,) = found["tensors"]
    assert tensor["name"] == PLANTED and tensor["differing"] == 1 and tensor["count"] == 64 * 64
    assert tensor["max_abs"] == ulp
    assert tensor["max_rel"] == pytest.approx(ulp / (abs(before) + ulp), rel=1e-12)
    code, table, _ = sexpgpu("diff", run_a, tmp_path / "b")
    assert code == 1 and "step 4: " in table and "param/fc2/w" in table and "1 of 4096" in table


def test_records_that_differ_are_listed(sexpgpu, tiny, run_a, tmp_path):
    tiny.write_text(tiny.read_text().replace(":seed 20261129", ":seed 7"))
    sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "b")
    code, out, _ = sexpgpu("diff", run_a, tmp_path / "b", "--json")
    found = json.loads(out)
    assert code == 1 and found["first_step"] == 1
    assert ["experiment.run.seed", 20261129, 7] in found["records"]
    code, table, _ = sexpgpu("diff", run_a, tmp_path / "b")
    assert "experiment.run.seed" in table and "… and" in table  # 18 tensors differ: the table is capped


def test_records_that_differ_with_the_same_bits_explain_and_do_not_differ(sexpgpu, tiny, run_a, tmp_path):
    sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "b", "--choices", run_a / "step-3")
    code, out, _ = sexpgpu("diff", run_a, tmp_path / "b", "--json")
    found = json.loads(out)
    assert code == 0 and found["identical"] is True
    assert found["records"] == [["flags.choices.choices", None, str(run_a / "step-3")]]


def test_a_run_that_stopped_early_differs_by_its_missing_steps(sexpgpu, run_a, tmp_path):
    (tmp_path / "short").mkdir()
    lines = (run_a / "metrics.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "short/metrics.jsonl").write_text("".join(lines[:4]) + lines[4][:10])  # a torn last line
    code, out, _ = sexpgpu("diff", run_a, tmp_path / "short", "--json")
    assert code == 1 and json.loads(out)["only_in"] == {"a": [4, 5, 6]}


def test_bad_input_is_E_DIFF(sexpgpu, run_a, tmp_path):
    code, _, err = sexpgpu("diff", run_a, tmp_path / "nowhere")
    assert code == 2 and "E-DIFF-001" in err
    (tmp_path / "empty").mkdir()
    assert "E-DIFF-001" in sexpgpu("diff", run_a, tmp_path / "empty")[2]
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "loss": 1}\nnot json\n')
    code, _, err = sexpgpu("diff", run_a, tmp_path / "bad.jsonl")
    assert code == 2 and "E-DIFF-002" in err and "bad.jsonl:2" in err
    (tmp_path / "c").mkdir()
    shutil.copy(run_a / "metrics.jsonl", tmp_path / "c")
    (tmp_path / "c/experiment.json").write_text("{")
    assert "E-DIFF-002" in sexpgpu("diff", run_a, tmp_path / "c")[2]
