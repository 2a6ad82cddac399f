"""Every field of a commit marker and a record is checked before it is used; a directory's
name must agree with its record; a checkpoint's tensors must be those the caller expects;
an uncommitted step is found and replaced safely; `verify_checkpoint` hashes every file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from store_samples import BF16, sample_record, sample_tensors, same_tensors
from sexpgpu.errors import SexpgpuError
from sexpgpu.store import (TensorSpec, check_tensors, describe_checkpoint, read_checkpoint, resolve_checkpoint,
                           uncommitted_after, verify_checkpoint, write_checkpoint)
from sexpgpu.store.checks import FORMAT

GOOD_SHA = "ab" * 32


def write(root, step):
    return write_checkpoint(str(root), step, sample_tensors(step), sample_record(step), bf16=BF16)


def code_of(attempt) -> SexpgpuError:
    with pytest.raises(SexpgpuError) as caught:
        attempt()
    return caught.value


def good_marker(path: Path) -> dict:
    return json.loads((path / "COMMITTED").read_text())


MARKERS = {
    "a list": lambda m: [m],
    "a string": lambda m: "COMMITTED",
    "no format": lambda m: {k: v for k, v in m.items() if k != "format"},
    "another format": lambda m: {**m, "format": "sexpgpu-checkpoint/2"},
    "an extra key": lambda m: {**m, "note": 1},
    "no step": lambda m: {k: v for k, v in m.items() if k != "step"},
    "a string step": lambda m: {**m, "step": "3"},
    "a boolean step": lambda m: {**m, "step": True},
    "a negative step": lambda m: {**m, "step": -3},
    "a float step": lambda m: {**m, "step": 3.0},
    "another step": lambda m: {**m, "step": 4},
    "a digest that is a string": lambda m: {**m, "experiment.json": GOOD_SHA},
    "a digest without bytes": lambda m: {**m, "experiment.json": {"sha256": m["experiment.json"]["sha256"]}},
    "a short sha256": lambda m: {**m, "experiment.json": {**m["experiment.json"], "sha256": "abc"}},
    "an upper-case sha256": lambda m: {**m, "experiment.json": {**m["experiment.json"],
                                                                "sha256": m["experiment.json"]["sha256"].upper()}},
    "a sha256 that is a number": lambda m: {**m, "experiment.json": {**m["experiment.json"], "sha256": 7}},
    "bytes as a string": lambda m: {**m, "experiment.json": {**m["experiment.json"], "bytes": "12"}},
    "negative bytes": lambda m: {**m, "experiment.json": {**m["experiment.json"], "bytes": -1}},
    "bytes null": lambda m: {**m, "experiment.json": {**m["experiment.json"], "bytes": None}},
}


@pytest.mark.parametrize("damage", MARKERS, ids=list(MARKERS))
def test_every_field_of_the_marker_is_checked(tmp_path, damage):
    path = Path(write(tmp_path, 3))
    (path / "COMMITTED").write_text(json.dumps(MARKERS[damage](good_marker(path))))
    error = code_of(lambda: read_checkpoint(str(path)))
    assert error.code == "E-CKPT-001" and "COMMITTED" in error.message, error.render()


@pytest.mark.parametrize("text", ["", "{", "[" * 100_000, '{"step": 1e999}', "\xff\xfe", "1" * 5000])
def test_a_marker_that_is_not_json_is_E_CKPT_001(tmp_path, text):
    path = Path(write(tmp_path, 3))
    (path / "COMMITTED").write_bytes(text.encode("utf-8", "surrogateescape"))
    assert code_of(lambda: read_checkpoint(str(path))).code == "E-CKPT-001"


def rewrite_record(path: Path, change) -> None:
    """Change experiment.json and write a marker that matches it, as a careless tool would."""
    record = json.loads((path / "experiment.json").read_text())
    text = json.dumps(change(record)).encode()
    (path / "experiment.json").write_bytes(text)
    marker = {"format": FORMAT, "step": 3, "experiment.json": {"sha256": hashlib.sha256(text).hexdigest(),
                                                               "bytes": len(text)}}
    (path / "COMMITTED").write_text(json.dumps(marker))


RECORDS = {
    "a list": lambda r: [r],
    "another format": lambda r: {**r, "format": 1},
    "another step": lambda r: {**r, "step": 2},
    "a string step": lambda r: {**r, "step": "3"},
    "no tensors": lambda r: {k: v for k, v in r.items() if k != "tensors"},
    "tensors a list": lambda r: {**r, "tensors": list(r["tensors"])},
    "no model file": lambda r: {**r, "tensors": {"optimizer.safetensors": r["tensors"]["optimizer.safetensors"]}},
    "a file outside the checkpoint": lambda r: {**r, "tensors": {**r["tensors"], "../../etc/passwd": {"sha256": GOOD_SHA, "bytes": 1}}},
    "a digest that is a string": lambda r: {**r, "tensors": {**r["tensors"], "model.safetensors": GOOD_SHA}},
    "bytes a float": lambda r: {**r, "tensors": {**r["tensors"], "model.safetensors": {
        **r["tensors"]["model.safetensors"], "bytes": 1.5}}},
}


@pytest.mark.parametrize("damage", RECORDS, ids=list(RECORDS))
def test_every_field_the_store_reads_from_the_record_is_checked(tmp_path, damage):
    path = Path(write(tmp_path, 3))
    rewrite_record(path, RECORDS[damage])
    for attempt in (read_checkpoint, describe_checkpoint, verify_checkpoint):
        assert code_of(lambda: attempt(str(path))).code == "E-CKPT-001"


def test_a_step_directory_named_for_another_step_is_E_CKPT_005(tmp_path):
    (tmp_path / "run").mkdir()
    shutil.move(write(tmp_path, 2), tmp_path / "run" / "step-7")
    for attempt in (read_checkpoint, describe_checkpoint, verify_checkpoint):
        error = code_of(lambda: attempt(str(tmp_path / "run" / "step-7")))
        assert error.code == "E-CKPT-005" and "step 7" in error.message and "step 2" in error.message
    shutil.move(tmp_path / "run" / "step-7", tmp_path / "run" / "step-2")
    assert read_checkpoint(str(tmp_path / "run" / "step-2")).step == 2


def test_a_prefix_named_for_another_step_is_E_CKPT_005_on_s3(s3):
    write(s3.uri("run"), 2)
    for key in s3.keys("run/step-2/"):
        s3.client.copy_object(Bucket=s3.bucket, Key=key.replace("step-2", "step-5"),
                              CopySource={"Bucket": s3.bucket, "Key": key})
    assert code_of(lambda: read_checkpoint(s3.uri("run", "step-5"))).code == "E-CKPT-005"


def specs_of(tensors: dict, bf16=()) -> dict:
    names = {"bool": "BOOL", "float32": "F32", "int64": "I64", "int32": "I32"}
    return {name: TensorSpec(tuple(a.shape), "BF16" if name in bf16 else names[a.dtype.name]) for name, a in tensors.items()}


def test_a_checkpoint_holding_other_tensors_than_expected_is_E_CKPT_006_naming_each(tmp_path):
    checkpoint = read_checkpoint(write(tmp_path, 1))
    expected = specs_of(sample_tensors(1), BF16)
    check_tensors(checkpoint, expected)  # exactly what was written
    expected.pop("flags/seen")
    expected["param/new"] = TensorSpec((2,), "F32")
    expected["param/encoder/w"] = TensorSpec((4, 8), "F32")
    expected["param/head/w"] = TensorSpec((4, 3), "F32")
    error = code_of(lambda: check_tensors(checkpoint, expected))
    assert error.code == "E-CKPT-006"
    for named in ("missing param/new (F32 [2])", "extra flags/seen (BOOL [5])",
                  "param/encoder/w is F32 [8, 4] where the model has F32 [4, 8]",
                  "param/head/w is BF16 [4, 3] where the model has F32 [4, 3]"):
        assert named in error.message


def test_uncommitted_steps_after_a_checkpoint_are_named_locally(tmp_path):
    write(tmp_path, 1)
    write(tmp_path, 2)
    (tmp_path / "step-2" / "COMMITTED").unlink()
    (tmp_path / ".step-3.partial-x1").mkdir()
    (tmp_path / ".step-1.deleting").mkdir()
    assert uncommitted_after(str(tmp_path / "step-1"), 1) == {2: str(tmp_path / "step-2"),
                                                              3: str(tmp_path / ".step-3.partial-x1")}


def test_latest_with_only_uncommitted_steps_names_them(tmp_path):
    path = Path(write(tmp_path, 2))
    (path / "COMMITTED").unlink()
    error = code_of(lambda: resolve_checkpoint("latest", str(tmp_path)))
    assert error.code == "E-CKPT-003" and f"{path} was begun and never committed" in error.message


def test_an_uncommitted_step_directory_is_replaced_when_its_step_is_written_again(tmp_path):
    path = Path(write(tmp_path, 2))
    (path / "COMMITTED").unlink()
    (path / "stray").write_text("left by the interrupted writer")
    assert write(tmp_path, 2) == str(path)
    assert sorted(p.name for p in path.iterdir()) == ["COMMITTED", "experiment.json", "model.safetensors",
                                                      "optimizer.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]
    assert same_tensors(read_checkpoint(str(path)).tensors, sample_tensors(2))


def test_an_uncommitted_step_is_named_and_replaced_on_s3(s3):
    write(s3.uri("run"), 1)
    write(s3.uri("run"), 2)
    s3.client.delete_object(Bucket=s3.bucket, Key="run/step-2/COMMITTED")
    assert uncommitted_after(s3.uri("run", "step-1"), 1) == {2: s3.uri("run", "step-2")}
    assert write(s3.uri("run"), 2) == s3.uri("run", "step-2")
    assert uncommitted_after(s3.uri("run", "step-1"), 1) == {}
    assert same_tensors(read_checkpoint(s3.uri("run", "step-2")).tensors, sample_tensors(2))


def test_verify_counts_each_file_and_finds_a_changed_byte(tmp_path):
    path = Path(write(tmp_path, 4))
    verified = verify_checkpoint(str(path))
    assert verified.step == 4
    assert verified.files == {
        "model.safetensors": {"bytes": (path / "model.safetensors").stat().st_size, "tensors": 3},
        "optimizer.safetensors": {"bytes": (path / "optimizer.safetensors").stat().st_size, "tensors": 5},
    }
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-1] ^= 0x80
    (path / "model.safetensors").write_bytes(bytes(data))
    error = code_of(lambda: verify_checkpoint(str(path)))
    assert error.code == "E-CKPT-001" and "model.safetensors has SHA-256" in error.message
