"""Our safetensors writer and reader against the `safetensors` library, in both directions."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sexpgpu.store import safetensors_io as sio

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                "float16", "float32", "float64"]


def write(path, tensors, bf16=(), metadata=None):
    encoded = sio.encode(tensors, bf16, metadata)
    with open(path, "wb") as file:
        for buffer in encoded.buffers:
            file.write(buffer)
    assert path.stat().st_size == encoded.nbytes
    return path


def read(path):
    data = path.read_bytes()
    header = sio.parse_header(data, len(data))
    return sio.decode_all(header, data), header


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


arrays = hnp.arrays(
    dtype=st.sampled_from(NUMPY_DTYPES).map(np.dtype),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
)


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda s: s != "__metadata__"), arrays, max_size=5))
def test_the_library_reads_what_we_write_bit_for_bit(tmp_path_factory, tensors):
    path = write(tmp_path_factory.mktemp("st") / "ours.safetensors", tensors)
    theirs = safetensors.numpy.load_file(str(path))
    assert sorted(theirs) == sorted(tensors)
    for name, array in tensors.items():
        assert same_bits(theirs[name], np.asarray(array)), name


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda s: s != "__metadata__"), arrays, max_size=5))
def test_we_read_what_the_library_writes_bit_for_bit(tmp_path_factory, tensors):
    path = tmp_path_factory.mktemp("st") / "theirs.safetensors"
    safetensors.numpy.save_file({k: np.array(v, order="C") for k, v in tensors.items()}, str(path),
                                metadata={"made": "by the library"})
    ours, header = read(path)
    assert header.metadata == {"made": "by the library"}
    assert sorted(ours) == sorted(tensors)
    for name, array in tensors.items():
        assert same_bits(ours[name], np.asarray(array)), name


def test_bf16_is_stored_as_the_high_halves_and_torch_reads_the_same_values(tmp_path):
    values = torch.randn(4, 7).to(torch.bfloat16)
    as_float32 = values.float().numpy()  # the interpreter's form: float32 with zero low halves
    path = write(tmp_path / "bf16.safetensors", {"w": as_float32}, bf16=["w"])
    theirs = safetensors.torch.load_file(str(path))["w"]
    assert theirs.dtype == torch.bfloat16 and torch.equal(theirs.view(torch.int16), values.view(torch.int16))
    ours, header = read(path)
    assert header.entries["w"].dtype == "BF16"
    assert same_bits(ours["w"], as_float32)


def test_bf16_written_by_torch_reads_back_to_float32_exactly(tmp_path):
    values = torch.randn(3, 5).to(torch.bfloat16)
    path = tmp_path / "torch.safetensors"
    safetensors.torch.save_file({"w": values}, str(path))
    ours, _ = read(path)
    assert same_bits(ours["w"], values.float().numpy())


def test_a_bf16_name_with_values_bf16_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="bf16 cannot hold"):
        sio.encode({"w": np.array([1.0 + 2.0**-20], np.float32)}, bf16=["w"])


def test_every_tensor_starts_aligned_to_its_item_size():
    encoded = sio.encode({"a": np.zeros(3, np.uint8), "b": np.zeros(2, np.float64), "c": np.zeros(5, np.float32)})
    data = b"".join(bytes(b) for b in encoded.buffers)
    header = sio.parse_header(data, len(data))
    assert header.data_start % 8 == 0
    for entry in header.entries.values():
        assert (header.data_start + entry.begin) % sio.STORED_DTYPES[entry.dtype].itemsize == 0


def test_big_endian_and_strided_arrays_are_written_little_endian_and_contiguous(tmp_path):
    big = np.arange(12, dtype=">i4").reshape(3, 4)
    strided = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    path = write(tmp_path / "x.safetensors", {"big": big, "strided": strided})
    theirs = safetensors.numpy.load_file(str(path))
    assert np.array_equal(theirs["big"], big) and theirs["big"].dtype == np.dtype("<i4")
    assert np.array_equal(theirs["strided"], strided)


def valid_file() -> bytes:
    encoded = sio.encode({"w": np.arange(4, dtype=np.float32)})
    return b"".join(bytes(b) for b in encoded.buffers)


def with_header(header: dict, data: bytes = b"") -> bytes:
    import json

    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("data, rule", [
    (b"\x01\x02", "shorter than the 8-byte"),
    (struct.pack("<Q", 1 << 40), "over the"),
    (struct.pack("<Q", 100) + b"{}", "the file ends"),
    (with_header([]), "not a JSON object"),
    (with_header({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "dtype"),
    (with_header({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), "shape"),
    (with_header({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "needs 8"),
    (with_header({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"\0" * 2), "a hole"),
    (with_header({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, b"\0"), "exactly"),
    (with_header({"__metadata__": {"k": 1}}), "strings to strings"),
])
def test_each_broken_rule_is_named(data, rule):
    with pytest.raises(sio.SafetensorsFormatError, match=rule):
        sio.parse_header(data, len(data))


def test_a_truncated_file_is_refused_when_the_size_is_known():
    data = valid_file()
    with pytest.raises(sio.SafetensorsFormatError, match="the file has"):
        sio.parse_header(data[:-1], len(data) - 1)
