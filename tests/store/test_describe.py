"""`sexpgpu checkpoint PATH`: what the store tells about a checkpoint, reading only headers."""

from __future__ import annotations

import json

from store_samples import BF16, sample_record, sample_tensors
from sexpgpu.store import describe_checkpoint, format_checkpoint, load_parameter, write_checkpoint


def written(root, tmp_path):
    import safetensors.numpy
    import numpy as np

    safetensors.numpy.save_file({"w": np.ones((2, 2), np.float32)}, str(tmp_path / "init.safetensors"))
    _, pin = load_parameter(str(tmp_path / "init.safetensors"), "w", (2, 2), "encoder/w")
    record = {**sample_record(6), "loads": [pin.to_json()], "choices": {"stacking": 1}}
    return write_checkpoint(root, 6, sample_tensors(6), record, bf16=BF16), pin


def test_the_summary_names_everything_the_command_prints(tmp_path):
    path, pin = written(str(tmp_path / "run"), tmp_path)
    summary = describe_checkpoint(path)
    assert summary["step"] == 6 and summary["path"] == path
    assert summary["experiment"] == {"name": "tiny", "digest": "sha256:" + "ab" * 32}
    assert summary["selection"] == "tiny" and summary["flags"] == {"deterministic": True}
    assert summary["choices"] == {"stacking": 1} and summary["loads"] == [pin.to_json()]
    tensors = {t["name"]: t for t in summary["tensors"]}
    assert sorted(tensors) == sorted(sample_tensors(6))
    assert tensors["param/head/w"] == {"name": "param/head/w", "file": "model.safetensors", "dtype": "BF16", "shape": [4, 3]}
    assert tensors["state/count"] == {"name": "state/count", "file": "optimizer.safetensors", "dtype": "I64", "shape": []}
    json.dumps(summary)  # --json prints it as it is


def test_the_text_form(tmp_path):
    path, pin = written(str(tmp_path / "run"), tmp_path)
    text = format_checkpoint(describe_checkpoint(path))
    lines = text.splitlines()
    assert lines[0].split() == ["checkpoint", path] and lines[1].split() == ["step", "6"]
    assert "tiny  sha256:abab" in text and "deterministic=true" in text and '"stacking": 1' in text
    assert f"encoder/w  <-  {pin.file}  tensor w, {pin.bytes} bytes, sha256 {pin.version}" in text
    assert any(line.split() == ["param/head/w", "BF16", "[4,", "3]", "model.safetensors"] for line in lines)


def test_describing_an_s3_checkpoint(s3, tmp_path):
    path, _ = written(s3.uri("run"), tmp_path)
    assert describe_checkpoint(path)["step"] == 6
