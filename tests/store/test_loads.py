"""`:load` parameters: reading one tensor from a file or a sharded checkpoint, locally and on
S3, and pins that catch any change to the file."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from sexpgpu.errors import SexpgpuError
from sexpgpu.store import LoadPin, load_parameter, verify_load_pin

MIB = 1024 * 1024


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"encoder/w": rng.standard_normal((6, 4), dtype=np.float32),
            "encoder/b": rng.standard_normal(4, dtype=np.float32),
            "head/w": rng.standard_normal((4, 2), dtype=np.float32)}


def save(path, tensors) -> str:
    safetensors.numpy.save_file(tensors, str(path))
    return str(path)


def sharded(folder) -> str:
    """A two-shard checkpoint with its index, as Hugging Face writes them."""
    tensors = weights()
    save(folder / "model-00001-of-00002.safetensors", {k: tensors[k] for k in ("encoder/w", "encoder/b")})
    save(folder / "model-00002-of-00002.safetensors", {"head/w": tensors["head/w"]})
    index = {"metadata": {"total_size": 0}, "weight_map": {
        "encoder/w": "model-00001-of-00002.safetensors", "encoder/b": "model-00001-of-00002.safetensors",
        "head/w": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(folder / "model.safetensors.index.json")


def test_a_tensor_loads_from_a_local_file_with_a_sha256_pin(tmp_path):
    path = save(tmp_path / "w.safetensors", weights())
    array, pin = load_parameter(path, "encoder/w", (6, 4), "model/w")
    assert array.dtype == np.float32 and np.array_equal(array, weights()["encoder/w"])
    data = (tmp_path / "w.safetensors").read_bytes()
    assert pin == LoadPin("model/w", path, path, "encoder/w", len(data), hashlib.sha256(data).hexdigest(), "sha256")
    assert verify_load_pin(pin.to_json()) == pin


def test_the_tensor_name_defaults_to_the_parameter_path(tmp_path):
    path = save(tmp_path / "w.safetensors", weights())
    array, pin = load_parameter(path, None, (4,), "encoder/b")
    assert np.array_equal(array, weights()["encoder/b"]) and pin.tensor == "encoder/b"


def test_an_index_pins_the_shard_it_read(tmp_path):
    index = sharded(tmp_path)
    array, pin = load_parameter(index, "head/w", (4, 2), "head/w")
    assert np.array_equal(array, weights()["head/w"])
    assert pin.source == index and pin.file == str(tmp_path / "model-00002-of-00002.safetensors")
    assert pin.bytes == (tmp_path / "model-00002-of-00002.safetensors").stat().st_size


def test_bf16_and_f16_files_widen_exactly(tmp_path):
    values = torch.randn(3, 4)
    safetensors.torch.save_file({"b": values.bfloat16(), "h": values.half()}, str(tmp_path / "t.safetensors"))
    from_bf16, _ = load_parameter(str(tmp_path / "t.safetensors"), "b", (3, 4), "p", dtype="bf16")
    from_f16, _ = load_parameter(str(tmp_path / "t.safetensors"), "h", (3, 4), "p")
    assert np.array_equal(from_bf16, values.bfloat16().float().numpy())
    assert np.array_equal(from_f16, values.half().float().numpy())


@pytest.mark.parametrize("tensor, shape, dtype, words", [
    ("encoder/ww", (6, 4), "f32", "has no tensor 'encoder/ww'. Did you mean 'encoder/w'?"),
    ("encoder/w", (4, 6), "f32", "has shape [6, 4], but the parameter is declared [4, 6]"),
    ("steps", (3,), "f32", "is I64"),
    ("encoder/w", (6, 4), "bf16", "bf16 cannot hold"),
])
def test_a_wrong_tensor_is_E_LOAD_002(tmp_path, tensor, shape, dtype, words):
    path = save(tmp_path / "w.safetensors", {**weights(), "steps": np.arange(3)})
    with pytest.raises(SexpgpuError) as caught:
        load_parameter(path, tensor, shape, "model/w", dtype=dtype)
    assert caught.value.code == "E-LOAD-002" and words in caught.value.render()


def test_missing_and_broken_files_are_E_LOAD_002(tmp_path):
    index = sharded(tmp_path)
    (tmp_path / "bad.json").write_text("{}")
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    for source, tensor, words in [
        (str(tmp_path / "none.safetensors"), "w", "there is no file"),
        (index, "head/x", "maps no tensor 'head/x'"),
        (str(tmp_path / "bad.json"), "w", "weight_map"),
        (str(tmp_path / "bad.safetensors"), "w", "not a valid safetensors file"),
    ]:
        with pytest.raises(SexpgpuError) as caught:
            load_parameter(source, tensor, (4, 2), "p")
        assert caught.value.code == "E-LOAD-002" and words in caught.value.message, caught.value.message
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(SexpgpuError) as caught:
        load_parameter(index, "head/w", (4, 2), "p")
    assert caught.value.code == "E-LOAD-002"


def test_a_changed_local_file_is_E_LOAD_001_showing_both_versions(tmp_path):
    path = save(tmp_path / "w.safetensors", weights(0))
    _, pin = load_parameter(path, "encoder/w", (6, 4), "model/w")
    save(tmp_path / "w.safetensors", weights(1))  # same size, other bytes
    with pytest.raises(SexpgpuError) as caught:
        verify_load_pin(pin)
    assert caught.value.code == "E-LOAD-001"
    found = hashlib.sha256((tmp_path / "w.safetensors").read_bytes()).hexdigest()
    assert pin.version in caught.value.message and found in caught.value.message
    save(tmp_path / "w.safetensors", {"encoder/w": weights(0)["encoder/w"]})  # other size
    with pytest.raises(SexpgpuError, match="size") as caught:
        verify_load_pin(pin)
    assert caught.value.code == "E-LOAD-001"


def test_a_tensor_gone_from_the_file_is_E_LOAD_001(tmp_path):
    path = save(tmp_path / "w.safetensors", weights())
    _, pin = load_parameter(path, "head/w", (4, 2), "head/w")
    save(tmp_path / "w.safetensors", {"head/v": weights()["head/w"], **{k: v for k, v in weights().items() if k != "head/w"}})
    with pytest.raises(SexpgpuError, match="tensor 'head/w' recorded") as caught:
        verify_load_pin(pin)
    assert caught.value.code == "E-LOAD-001"


def test_the_same_bytes_at_a_new_path_pass_and_the_pin_names_the_new_path(tmp_path):
    (tmp_path / "a").mkdir()
    index = sharded(tmp_path / "a")
    _, pin = load_parameter(index, "encoder/w", (6, 4), "encoder/w")
    shutil.copytree(tmp_path / "a", tmp_path / "bundle")
    shutil.rmtree(tmp_path / "a")
    moved = verify_load_pin(pin, str(tmp_path / "bundle" / "model.safetensors.index.json"))
    assert moved.file == str(tmp_path / "bundle" / "model-00001-of-00002.safetensors")
    assert (moved.bytes, moved.version, moved.tensor) == (pin.bytes, pin.version, pin.tensor)
    with pytest.raises(SexpgpuError) as caught:  # and the old path is gone
        verify_load_pin(pin)
    assert caught.value.code == "E-LOAD-002"


def upload(s3, key: str, path, part_size: int | None = None) -> str:
    """Put a file on the server, in parts of `part_size` if given; returns its ETag."""
    data = open(path, "rb").read()
    if part_size is None:
        return s3.client.put_object(Bucket=s3.bucket, Key=key, Body=data)["ETag"]
    upload_id = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(data), part_size), 1):
        reply = s3.client.upload_part(Bucket=s3.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                      Body=data[start : start + part_size])
        parts.append({"PartNumber": number, "ETag": reply["ETag"]})
    return s3.client.complete_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=upload_id,
                                               MultipartUpload={"Parts": parts})["ETag"]


def big_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"big": rng.standard_normal(3 * MIB, dtype=np.float32), "small": np.arange(5, dtype=np.float32)}


def test_a_single_part_object_is_pinned_by_its_etag(s3, tmp_path):
    path = save(tmp_path / "w.safetensors", weights())
    etag = upload(s3, "models/w.safetensors", path)
    array, pin = load_parameter(s3.uri("models/w.safetensors"), "encoder/w", (6, 4), "model/w")
    assert np.array_equal(array, weights()["encoder/w"])
    assert (pin.version, pin.version_kind, pin.bytes) == (etag, "etag", (tmp_path / "w.safetensors").stat().st_size)
    assert verify_load_pin(pin) == pin


def test_a_multipart_etag_is_pinned_as_the_string_it_is(s3, tmp_path):
    path = save(tmp_path / "big.safetensors", big_weights())
    etag = upload(s3, "models/big.safetensors", path, part_size=5 * MIB)
    assert etag.strip('"').endswith("-3")
    array, pin = load_parameter(s3.uri("models/big.safetensors"), "big", (3 * MIB,), "big")
    assert np.array_equal(array, big_weights()["big"]) and pin.version == etag
    assert verify_load_pin(pin) == pin


def test_an_index_on_s3_pins_the_shard(s3, tmp_path):
    index = sharded(tmp_path)
    for name in ("model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        upload(s3, f"hub/{name}", tmp_path / name)
    array, pin = load_parameter(s3.uri("hub/model.safetensors.index.json"), "encoder/b", (4,), "encoder/b")
    assert np.array_equal(array, weights()["encoder/b"])
    assert pin.file == s3.uri("hub/model-00001-of-00002.safetensors") and index.endswith("index.json")


def test_a_changed_object_is_E_LOAD_001(s3, tmp_path):
    save(tmp_path / "w.safetensors", weights(0))
    upload(s3, "w.safetensors", tmp_path / "w.safetensors")
    _, pin = load_parameter(s3.uri("w.safetensors"), "encoder/w", (6, 4), "model/w")
    save(tmp_path / "w.safetensors", weights(1))
    upload(s3, "w.safetensors", tmp_path / "w.safetensors")
    with pytest.raises(SexpgpuError) as caught:
        verify_load_pin(pin)
    assert caught.value.code == "E-LOAD-001" and pin.version in caught.value.message


def test_an_s3_pin_passes_for_a_local_copy_of_the_same_bytes(s3, tmp_path):
    save(tmp_path / "w.safetensors", weights())
    upload(s3, "w.safetensors", tmp_path / "w.safetensors")
    save(tmp_path / "big.safetensors", big_weights())
    upload(s3, "big.safetensors", tmp_path / "big.safetensors", part_size=5 * MIB)
    for name, tensor, shape in (("w.safetensors", "encoder/w", (6, 4)), ("big.safetensors", "small", (5,))):
        _, pin = load_parameter(s3.uri(name), tensor, shape, "p")
        moved = verify_load_pin(pin, str(tmp_path / name))
        assert moved.file == str(tmp_path / name) and moved.version_kind == "sha256"
    save(tmp_path / "w.safetensors", weights(1))
    with pytest.raises(SexpgpuError) as caught:
        verify_load_pin(load_parameter(s3.uri("w.safetensors"), "encoder/w", (6, 4), "p")[1], str(tmp_path / "w.safetensors"))
    assert caught.value.code == "E-LOAD-001"


def test_a_local_pin_passes_for_an_s3_copy_of_the_same_bytes(s3, tmp_path):
    path = save(tmp_path / "w.safetensors", weights())
    _, pin = load_parameter(path, "encoder/w", (6, 4), "p")
    upload(s3, "copy.safetensors", tmp_path / "w.safetensors")
    moved = verify_load_pin(pin, s3.uri("copy.safetensors"))
    assert moved.version_kind == "etag" and moved.file == s3.uri("copy.safetensors")
