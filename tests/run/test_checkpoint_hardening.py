"""Checkpoints a resume must not trust blindly: an uncommitted newest step, a checkpoint whose
tensors do not fit the model, data named by another path, and `checkpoint --verify`.

Everything runs the command line's `main` in-process on a four-step run of a small
perceptron, so each case takes a second or two."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sexpgpu.cli.main import main
from sexpgpu.store import read_checkpoint, write_checkpoint
from sexpgpu.store.checkpoints import RESERVED_KEYS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def tiny_file(folder: Path, data: str | None = None, to: str | None = None) -> Path:
    """tiny-adam with 8 hidden units, 4 steps and a checkpoint every 2 (kept: all)."""
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{data or EXAMPLES / "data" / "spirals.npz"}"')
    target = f' :to "{to}"' if to else ""
    text = (text.replace(":steps 200", ":steps 4").replace(":hidden 64", ":hidden 8")
            .replace(":checkpoint 100", f":checkpoint (every 2{target})").replace(":every 50 :batches 4", ":every 4 :batches 1"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.sexp"
    path.write_text(text)
    return path


def sexpgpu(capsys, *args) -> tuple[int, str, str]:
    """`main` in-process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    status = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return status, out, err


def run(capsys, file, run_dir, *extra) -> tuple[int, str, str]:
    return sexpgpu(capsys, "run", file, "--device", "cpu", "--run-dir", run_dir, *extra)


def same_bits(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


# -- An uncommitted newest step ------------------------------------------------------------


def test_latest_names_an_uncommitted_newest_step_and_replaces_it_locally(tmp_path, capsys):
    file, run_dir = tiny_file(tmp_path), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    uninterrupted = read_checkpoint(str(run_dir / "step-4")).tensors
    (run_dir / "step-4" / "COMMITTED").unlink()  # as if the marker never reached the disk
    status, out, err = run(capsys, file, run_dir, "--resume", "latest")
    assert status == 0, err
    assert "step-4" in err and "not committed" in err
    assert "step-4" in out and "at step 2" in out  # the resume annotation says it too
    assert same_bits(read_checkpoint(str(run_dir / "step-4")).tensors, uninterrupted)
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith((".", "step-"))) == ["step-2", "step-4"]


def test_latest_names_an_uncommitted_newest_step_and_replaces_it_on_s3(tmp_path, capsys, s3):
    file, run_dir = tiny_file(tmp_path, to=s3.uri("ckpt")), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    uninterrupted = read_checkpoint(s3.uri("ckpt", "step-4")).tensors
    s3.client.delete_object(Bucket=s3.bucket, Key="ckpt/step-4/COMMITTED")
    status, out, err = run(capsys, file, run_dir, "--resume", "latest")
    assert status == 0, err
    assert "step-4" in err and "not committed" in err
    assert same_bits(read_checkpoint(s3.uri("ckpt", "step-4")).tensors, uninterrupted)


# -- A damaged later checkpoint --------------------------------------------------------------


def test_a_resume_replaces_a_damaged_later_checkpoint_and_says_so(tmp_path, capsys):
    file, run_dir = tiny_file(tmp_path), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    uninterrupted = read_checkpoint(str(run_dir / "step-4")).tensors
    model = run_dir / "step-4" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:100])
    status, _, err = run(capsys, file, run_dir, "--resume", run_dir / "step-2")
    assert status == 0, err
    assert f"{run_dir / 'step-4'} is damaged: model.safetensors has 100 bytes" in err and "replaced" in err
    status, out, err = sexpgpu(capsys, "checkpoint", "--verify", run_dir / "step-4")
    assert status == 0 and out.startswith("OK"), err
    assert same_bits(read_checkpoint(str(run_dir / "step-4")).tensors, uninterrupted)


def test_a_resume_replaces_a_damaged_later_checkpoint_on_s3(tmp_path, capsys, s3):
    file, run_dir = tiny_file(tmp_path, to=s3.uri("ckpt")), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    s3.client.put_object(Bucket=s3.bucket, Key="ckpt/step-4/model.safetensors", Body=b"cut")
    status, _, err = run(capsys, file, run_dir, "--resume", s3.uri("ckpt", "step-2"))
    assert status == 0, err
    assert "damaged" in err and "replaced" in err
    assert sexpgpu(capsys, "checkpoint", "--verify", s3.uri("ckpt", "step-4"))[0] == 0


# -- Where a resume looks -------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", "s3"])
def test_resume_latest_finds_the_checkpoints_where_the_run_directory_records_them(tmp_path, capsys, request, where):
    destination = request.getfixturevalue("s3").uri("ckpt") if where == "s3" else str(tmp_path / "ckpt")
    file, run_dir = tiny_file(tmp_path), tmp_path / "run"
    assert run(capsys, file, run_dir, "--checkpoint-to", destination)[0] == 0
    assert json.loads((run_dir / "experiment.json").read_text())["checkpoints"] == destination
    status, out, err = run(capsys, file, run_dir, "--resume", "latest")  # no --checkpoint-to: the record says where
    assert status == 0, err
    assert f"{destination}/step-4 at step 4" in out


def test_the_records_hold_the_world_and_a_checkpoint_without_it_still_resumes(tmp_path, capsys):
    file, run_dir = tiny_file(tmp_path), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    one = {"processes": 1, "nodes": 1}
    assert json.loads((run_dir / "experiment.json").read_text())["world"] == one
    checkpoint = read_checkpoint(str(run_dir / "step-2"))
    assert checkpoint.experiment["world"] == one
    # a checkpoint written before the world was recorded
    older = {key: value for key, value in checkpoint.experiment.items() if key not in (*RESERVED_KEYS, "world")}
    write_checkpoint(str(tmp_path / "older"), 2, checkpoint.tensors, older)
    status, _, err = run(capsys, file, tmp_path / "resumed", "--resume", tmp_path / "older" / "step-2")
    assert status == 0, err
    assert same_bits(read_checkpoint(str(tmp_path / "resumed" / "step-4")).tensors,
                     read_checkpoint(str(run_dir / "step-4")).tensors)


def test_a_missing_step_names_the_checkpoint_root_searched_not_the_working_directory(tmp_path, capsys, monkeypatch):
    file, run_dir = tiny_file(tmp_path), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    status, _, err = run(capsys, file, run_dir, "--resume", "step-7")
    assert status == 2 and "E-CKPT-003" in err
    assert f"{run_dir / 'step-7'}" in err and f"{run_dir} has committed steps [2, 4]" in err
    assert str(tmp_path / "elsewhere") not in err


# -- A record whose tensors do not fit the model -------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """(experiment file, run directory) of a finished four-step run; tests only read it."""
    folder = tmp_path_factory.mktemp("finished")
    file = tiny_file(folder)
    assert main(["run", str(file), "--device", "cpu", "--run-dir", str(folder / "run")]) == 0
    return file, folder / "run"


def rewritten(source: Path, dest_root: Path, change) -> Path:
    """A consistent checkpoint (digests and marker recomputed) with `change` applied to its tensors."""
    checkpoint = read_checkpoint(str(source))
    record = {key: value for key, value in checkpoint.experiment.items() if key not in RESERVED_KEYS}
    tensors = dict(checkpoint.tensors)
    change(tensors)
    bf16 = [name for name, dtype in checkpoint.stored_dtypes.items() if dtype == "BF16" and name in tensors]
    return Path(write_checkpoint(str(dest_root), checkpoint.step, tensors, record, bf16=bf16))


def drop(name):
    return lambda tensors: tensors.pop(name)


def add(name, array):
    return lambda tensors: tensors.__setitem__(name, array)


def reshape(name):
    return lambda tensors: tensors.__setitem__(name, tensors[name].reshape(-1))


def widen(name):
    return lambda tensors: tensors.__setitem__(name, tensors[name].astype(np.float64))


@pytest.mark.parametrize("change, named", [
    (drop("param/fc1/w"), "missing param/fc1/w"),
    (drop("state/m/head/b"), "missing state/m/head/b"),
    (add("param/fc3/w", np.zeros((2, 2), np.float32)), "extra param/fc3/w"),
    (add("state/z/fc1/w", np.zeros((2, 2), np.float32)), "extra state/z/fc1/w"),
    (add("junk", np.zeros(3, np.int32)), "extra junk"),
    (reshape("param/fc2/w"), "param/fc2/w"),
    (widen("state/v/fc1/b"), "F64"),
])
def test_a_checkpoint_whose_tensors_do_not_fit_the_model_is_E_CKPT_006_before_any_step(tmp_path, capsys, finished,
                                                                                       change, named):
    file, run_dir = finished
    broken = rewritten(run_dir / "step-2", tmp_path / "broken", change)
    status, out, err = run(capsys, file, tmp_path / "resumed", "--resume", broken)
    assert status == 2 and "E-CKPT-006" in err and named in err, err
    assert not (tmp_path / "resumed" / "metrics.jsonl").exists()


# -- Data named by content, not by the path as typed ---------------------------------------


def test_a_resume_from_another_folder_or_by_absolute_path_finds_the_same_data(tmp_path, capsys, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EXAMPLES / "data" / "spirals.npz", project / "spirals.npz")
    tiny_file(project, data="spirals.npz")
    monkeypatch.chdir(project)
    assert run(capsys, "tiny.sexp", "run")[0] == 0
    status, _, err = run(capsys, project / "tiny.sexp", project / "run", "--resume", "step-2")
    assert status == 0, err
    monkeypatch.chdir(tmp_path)
    status, _, err = run(capsys, "project/tiny.sexp", "project/run", "--resume", "step-2")
    assert status == 0, err


def test_data_changed_under_the_same_path_is_E_CKPT_002(tmp_path, capsys):
    data = tmp_path / "spirals.npz"
    shutil.copy(EXAMPLES / "data" / "spirals.npz", data)
    file, run_dir = tiny_file(tmp_path, data=str(data)), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    records = dict(np.load(data))
    records["x"] = records["x"][::-1].copy()
    np.savez(data, **records)
    status, _, err = run(capsys, file, tmp_path / "other", "--resume", run_dir / "step-2")
    assert status == 2 and "E-CKPT-002" in err and "sha256" in err, err


@pytest.mark.parametrize("written, resumed, refused", [(None, "off", True), (None, "on", False), ("off", None, True)])
def test_a_resume_under_another_patterns_setting_is_E_CKPT_002(tmp_path, capsys, monkeypatch, written, resumed, refused):
    """SEXPGPU_PATTERNS is part of a run's configuration (determinism.md, "What the run's
    configuration decides"): its default is recorded as `on`, so an explicit `on` resumes it."""
    file, run_dir = tiny_file(tmp_path), tmp_path / "run"
    for setting, then in ((written, None), (resumed, run_dir / "step-2")):
        if setting is None:
            monkeypatch.delenv("SEXPGPU_PATTERNS", raising=False)
        else:
            monkeypatch.setenv("SEXPGPU_PATTERNS", setting)
        status, _, err = run(capsys, file, tmp_path / ("again" if then else "run"), *(("--resume", then) if then else ()))
    recorded = json.loads((run_dir / "step-2" / "experiment.json").read_text())["environment"]
    assert recorded["SEXPGPU_PATTERNS"] == (written or "on")
    if refused:
        assert status == 2 and "E-CKPT-002" in err and "environment.SEXPGPU_PATTERNS: checkpoint" in err, err
    else:
        assert status == 0, err


def test_a_checkpoint_from_before_patterns_were_recorded_ran_none():
    from sexpgpu.run.checkpointing import _patterns_recorded

    old = {"environment": {"SEXPGPU_OPTIMIZE": "on"}, "step": 2}
    assert _patterns_recorded(old) == {"environment": {"SEXPGPU_OPTIMIZE": "on", "SEXPGPU_PATTERNS": "off"}, "step": 2}
    assert _patterns_recorded({"environment": {"SEXPGPU_PATTERNS": "on"}})["environment"] == {"SEXPGPU_PATTERNS": "on"}


# -- checkpoint --verify -----------------------------------------------------------------


def test_verify_hashes_every_tensor_file_and_names_the_first_mismatch(tmp_path, capsys):
    file, run_dir = tiny_file(tmp_path), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    status, out, err = sexpgpu(capsys, "checkpoint", "--verify", run_dir / "step-4")
    assert status == 0, err
    assert out.startswith("OK") and "step 4" in out and "optimizer.safetensors" in out
    status, out, _ = sexpgpu(capsys, "checkpoint", "--verify", "--json", run_dir / "step-4")
    files = json.loads(out)["files"]
    assert status == 0 and files["model.safetensors"] == {"bytes": (run_dir / "step-4" / "model.safetensors").stat().st_size,
                                                          "tensors": 6}
    data = bytearray((run_dir / "step-4" / "optimizer.safetensors").read_bytes())
    data[-1] ^= 0x40  # a bit in the last tensor's data: the header still parses
    (run_dir / "step-4" / "optimizer.safetensors").write_bytes(bytes(data))
    assert sexpgpu(capsys, "checkpoint", run_dir / "step-4")[0] == 0  # headers only: not seen
    status, out, err = sexpgpu(capsys, "checkpoint", "--verify", run_dir / "step-4")
    assert status == 2 and "E-CKPT-001" in err and "optimizer.safetensors" in err and "OK" not in out


def test_verify_on_s3(tmp_path, capsys, s3):
    file, run_dir = tiny_file(tmp_path, to=s3.uri("ckpt")), tmp_path / "run"
    assert run(capsys, file, run_dir)[0] == 0
    status, out, _ = sexpgpu(capsys, "checkpoint", "--verify", s3.uri("ckpt", "step-2"))
    assert status == 0 and out.startswith("OK")
    key = "ckpt/step-2/model.safetensors"
    body = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[-2] ^= 0x01
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))
    status, _, err = sexpgpu(capsys, "checkpoint", "--verify", s3.uri("ckpt", "step-2"))
    assert status == 2 and "E-CKPT-001" in err and "model.safetensors" in err


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_resume_with_a_bf16_layer_passes_the_tensor_check_and_repeats_the_bits(tmp_path, capsys, device):
    file = tiny_file(tmp_path)
    # A bf16 scale on the output: a parameter stored as BF16 beside the float32 ones.
    scaled = "(mul (linear h2 :out classes :as head) (cast (param scale (3) :init (ones) :dtype bf16) f32)))"
    file.write_text(file.read_text().replace("(linear h2 :out classes :as head))", scaled))
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert sexpgpu(capsys, "run", file, "--device", device, "--run-dir", whole)[0] == 0
    assert read_checkpoint(str(whole / "step-2")).stored_dtypes["param/scale"] == "BF16"
    status, _, err = sexpgpu(capsys, "run", file, "--device", device, "--run-dir", resumed, "--resume", whole / "step-2")
    assert status == 0, err
    assert same_bits(read_checkpoint(str(resumed / "step-4")).tensors, read_checkpoint(str(whole / "step-4")).tensors)
