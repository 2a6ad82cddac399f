"""A checkpoint damaged in each of a few dozen ways, given to `checkpoint`, `checkpoint
--verify` and `run --resume` through the command line's `main` in-process: each says exit 2
with a code (or, for `checkpoint`, which reads only the record and the headers, may show
what it finds), never exit 3 and never a traceback.

Damage comes in two kinds. Raw damage (truncated, flipped, deleted, swapped files) breaks a
recorded digest. Sealed damage rewrites the digests and the commit marker to match, as a
careless tool would, so the reader must find what is wrong in the content itself."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

from sexpgpu.cli.main import main
from sexpgpu.store.checks import FORMAT

from test_checkpoint_hardening import tiny_file

CODE = re.compile(r"\bE-[A-Z0-9]+-\d{3}\b")
MODEL, OPTIMIZER, RECORD, MARKER = "model.safetensors", "optimizer.safetensors", "experiment.json", "COMMITTED"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[Path, Path]:
    """(experiment file, a committed step-4) of a four-step run."""
    folder = tmp_path_factory.mktemp("good")
    file = tiny_file(folder)
    assert main(["run", str(file), "--device", "cpu", "--run-dir", str(folder / "run")]) == 0
    return file, folder / "run" / "step-4"


# -- Raw damage ------------------------------------------------------------------------------


def truncate(name: str, keep: float | int):
    def damage(step: Path) -> None:
        data = (step / name).read_bytes()
        (step / name).write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    return damage


def flip(name: str, at: int, bit: int = 0x01):
    def damage(step: Path) -> None:
        data = bytearray((step / name).read_bytes())
        data[at] ^= bit
        (step / name).write_bytes(bytes(data))
    return damage


def delete(name: str):
    return lambda step: (step / name).unlink()


def into_directory(name: str):
    def damage(step: Path) -> None:
        (step / name).unlink()
        (step / name).mkdir()
    return damage


def append(name: str, extra: bytes):
    return lambda step: (step / name).write_bytes((step / name).read_bytes() + extra)


def swap_tensor_files(step: Path) -> None:
    (step / MODEL).rename(step / "swap")
    (step / OPTIMIZER).rename(step / MODEL)
    (step / "swap").rename(step / OPTIMIZER)


# -- Sealed damage: digests and marker rewritten to match ------------------------------------


def seal(step: Path, record_bytes: bytes | None = None) -> None:
    """Record each tensor file's digest in experiment.json (when it parses), then the marker."""
    if record_bytes is None:
        record = json.loads((step / RECORD).read_text())
        for name in record["tensors"]:
            data = (step / name).read_bytes()
            record["tensors"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        record_bytes = json.dumps(record, indent=2, sort_keys=True).encode()
    (step / RECORD).write_bytes(record_bytes)
    marker = {"format": FORMAT, "step": 4, RECORD: {"sha256": hashlib.sha256(record_bytes).hexdigest(),
                                                    "bytes": len(record_bytes)}}
    (step / MARKER).write_text(json.dumps(marker))


def sealed_header(change: Callable[[dict], object]):
    """model.safetensors with its header changed, the data kept."""
    def damage(step: Path) -> None:
        data = (step / MODEL).read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header = change(json.loads(data[8 : 8 + length]))
        text = header if isinstance(header, bytes) else json.dumps(header).encode()
        (step / MODEL).write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])
        seal(step)
    return damage


def sealed_length(length: int):
    def damage(step: Path) -> None:
        data = (step / MODEL).read_bytes()
        (step / MODEL).write_bytes(struct.pack("<Q", length) + data[8:])
        seal(step)
    return damage


def sealed_record(change: Callable[[dict], object]):
    """experiment.json changed, and the marker rewritten for it."""
    def damage(step: Path) -> None:
        changed = change(json.loads((step / RECORD).read_text()))
        seal(step, changed if isinstance(changed, bytes) else json.dumps(changed).encode())
    return damage


def edit(**fields):
    return lambda record: {**record, **fields}


def without(key: str):
    return lambda record: {k: v for k, v in record.items() if k != key}


def first_tensor(change: Callable[[dict], dict]):
    def header_change(header: dict) -> dict:
        name = sorted(k for k in header if k != "__metadata__")[0]
        return {**header, name: change(header[name])}
    return header_change


def renamed_to(name: str):
    def damage(step: Path) -> Path:
        return step.rename(step.parent / name)
    return damage


class Damage(NamedTuple):
    apply: Callable[[Path], object]
    verify_finds: bool = True  # False: the checkpoint is consistent, only the resume can refuse it


DAMAGES = {
    "model truncated to half": Damage(truncate(MODEL, 0.5)),
    "model truncated to nothing": Damage(truncate(MODEL, 0)),
    "model truncated to 7 bytes": Damage(truncate(MODEL, 7)),
    "optimizer one byte short": Damage(truncate(OPTIMIZER, -1)),
    "record truncated": Damage(truncate(RECORD, 0.5)),
    "marker truncated": Damage(truncate(MARKER, 0.5)),
    "marker empty": Damage(truncate(MARKER, 0)),
    "model deleted": Damage(delete(MODEL)),
    "optimizer deleted": Damage(delete(OPTIMIZER)),
    "record deleted": Damage(delete(RECORD)),
    "marker deleted": Damage(delete(MARKER)),
    "model is a directory": Damage(into_directory(MODEL)),
    "record is a directory": Damage(into_directory(RECORD)),
    "marker is a directory": Damage(into_directory(MARKER)),
    "header length flipped": Damage(flip(MODEL, 0, 0x80)),
    "header length's high byte flipped": Damage(flip(MODEL, 7, 0x80)),
    "header JSON flipped": Damage(flip(MODEL, 12, 0x20)),
    "tensor data flipped": Damage(flip(OPTIMIZER, -1, 0x40)),
    "record byte flipped": Damage(flip(RECORD, 40, 0x02)),
    "marker byte flipped": Damage(flip(MARKER, 30, 0x01)),
    "model has bytes appended": Damage(append(MODEL, b"\0" * 8)),
    "tensor files swapped": Damage(swap_tensor_files),
    "renamed to another step": Damage(renamed_to("step-9")),
    "sealed: header length beyond the file": Damage(sealed_length(1 << 40)),
    "sealed: header length zero": Damage(sealed_length(0)),
    "sealed: header not JSON": Damage(sealed_header(lambda header: b"{not json" + b" " * 40)),
    "sealed: header nested too deep": Damage(sealed_header(lambda header: b"[" * 100_000)),
    "sealed: header a list": Damage(sealed_header(lambda header: [header])),
    "sealed: unknown dtype": Damage(sealed_header(first_tensor(lambda t: {**t, "dtype": "F99"}))),
    "sealed: dtype a list": Damage(sealed_header(first_tensor(lambda t: {**t, "dtype": ["F32"]}))),
    "sealed: shape of strings": Damage(sealed_header(first_tensor(lambda t: {**t, "shape": ["8"]}))),
    "sealed: shape not matching offsets": Damage(sealed_header(first_tensor(lambda t: {**t, "shape": [t["shape"][0] + 1]}))),
    "sealed: offsets past the end": Damage(sealed_header(first_tensor(
        lambda t: {**t, "data_offsets": [t["data_offsets"][0] + 1000, t["data_offsets"][1] + 1000]}))),
    "sealed: offsets missing": Damage(sealed_header(first_tensor(lambda t: {"dtype": t["dtype"], "shape": t["shape"]}))),
    "sealed: record not JSON": Damage(sealed_record(lambda record: b"{\"format\": ")),
    "sealed: record nested too deep": Damage(sealed_record(lambda record: b"[" * 100_000 + b"]" * 100_000)),
    "sealed: record a list": Damage(sealed_record(lambda record: [record])),
    "sealed: format changed": Damage(sealed_record(edit(format="sexpgpu-checkpoint/0"))),
    "sealed: step a string": Damage(sealed_record(edit(step="4"))),
    "sealed: tensors deleted": Damage(sealed_record(without("tensors"))),
    "sealed: tensors a list": Damage(sealed_record(edit(tensors=[MODEL, OPTIMIZER]))),
    "sealed: a tensor file outside": Damage(sealed_record(
        lambda r: {**r, "tensors": {**r["tensors"], "../../../../etc/hostname": r["tensors"][MODEL]}})),
    "sealed: loads a string": Damage(sealed_record(edit(loads="w.safetensors"))),
    "sealed: a load pin without fields": Damage(sealed_record(edit(loads=[{"param": "fc1/w"}]))),
    "sealed: experiment a list": Damage(sealed_record(edit(experiment=[1, 2])), verify_finds=False),
    "sealed: experiment deleted": Damage(sealed_record(without("experiment")), verify_finds=False),
    "sealed: seed changed": Damage(sealed_record(
        lambda r: {**r, "experiment": {**r["experiment"], "resolved": {
            **r["experiment"]["resolved"], "run": {**r["experiment"]["resolved"]["run"], "seed": 1}}}}),
        verify_finds=False),
    "sealed: flags NaN": Damage(sealed_record(
        lambda record: json.dumps({**record, "flags": {"x": float("nan")}}).encode()), verify_finds=False),
    "sealed: microbatches a string": Damage(sealed_record(edit(microbatches="1")), verify_finds=False),
    "sealed: world size null": Damage(sealed_record(edit(world_size=None)), verify_finds=False),
    "sealed: device a number": Damage(sealed_record(edit(device=7)), verify_finds=False),
    "sealed: a huge number": Damage(sealed_record(lambda record: json.dumps(record).encode()[:-1]
                                                  + b', "data_position": ' + b"9" * 5000 + b"}")),
}


def outcome(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    assert status != 3 and "internal error" not in err and "Traceback" not in err, err
    assert status in (0, 2), (status, err)
    if status == 2:
        assert CODE.search(err), err
    return status, out, err


@pytest.mark.parametrize("name", DAMAGES, ids=list(DAMAGES))
def test_a_damaged_checkpoint_is_a_coded_error_for_every_command(tmp_path, capsys, good, name):
    file, source = good
    step = tmp_path / "ckpt" / "step-4"
    shutil.copytree(source, step)
    damage = DAMAGES[name]
    step = damage.apply(step) or step
    outcome(capsys, "checkpoint", step)
    verified, _, err = outcome(capsys, "checkpoint", "--verify", step)
    assert verified == (2 if damage.verify_finds else 0), err
    resumed, _, err = outcome(capsys, "run", file, "--device", "cpu", "--run-dir", tmp_path / "run", "--resume", step)
    assert resumed == 2, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


ON_S3 = ["model truncated to half", "optimizer deleted", "marker empty", "tensor data flipped",
         "renamed to another step", "sealed: header nested too deep", "sealed: a tensor file outside",
         "sealed: loads a string", "sealed: seed changed"]


@pytest.mark.parametrize("name", ON_S3)
def test_a_damaged_checkpoint_on_s3_is_a_coded_error_for_every_command(tmp_path, capsys, good, s3, name):
    file, source = good
    step = tmp_path / "ckpt" / "step-4"
    shutil.copytree(source, step)
    damage = DAMAGES[name]
    step = damage.apply(step) or step
    for local in step.iterdir():
        s3.client.put_object(Bucket=s3.bucket, Key=f"ckpt/{step.name}/{local.name}", Body=local.read_bytes())
    uri = s3.uri("ckpt", step.name)
    outcome(capsys, "checkpoint", uri)
    verified, _, err = outcome(capsys, "checkpoint", "--verify", uri)
    assert verified == (2 if damage.verify_finds else 0), err
    resumed, _, err = outcome(capsys, "run", file, "--device", "cpu", "--run-dir", tmp_path / "run", "--resume", uri)
    assert resumed == 2, err
