"""A file that is not what was expected is described, never quoted: no message echoes its
bytes, whether as text, as escaped bytes or as the number its first 8 bytes make."""

from __future__ import annotations

import struct

import pytest

from sexpgpu.errors import SexpgpuError
from sexpgpu.store import load_parameter

TEXT = b"password=hunter2-and-more-text\n"


def with_header(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize("content, quoted", [
    (TEXT, [str(int.from_bytes(TEXT[:8], "little")), "password", "hunter2", hex(int.from_bytes(TEXT[:8], "little"))]),
    (struct.pack("<Q", 5_000_123) + b"{}", ["5000123"]),
    (struct.pack("<Q", 6) + b"\xff\xfe{}\xfd\xfc", ["0xff", "\\xff", "0xfe"]),
    (struct.pack("<Q", 24) + b'{"w": "secret-value-77"}', ["secret-value-77"]),
    (with_header(b'{"w": {"dtype": "SECRETDTYPE", "shape": [1], "data_offsets": [0, 1]}}') + b"\0", ["SECRET"]),
    (with_header(b'{"w": {"dtype": "U8", "shape": ["SECRET"], "data_offsets": [0, 1]}}') + b"\0", ["SECRET"]),
])
def test_load_of_a_file_that_is_not_safetensors_quotes_none_of_it(tmp_path, content, quoted):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(content)
    with pytest.raises(SexpgpuError) as caught:
        load_parameter(str(path), "w", (1,), "model/w")
    text = caught.value.render()
    assert caught.value.code == "E-LOAD-002" and "is not a valid safetensors file" in text
    for piece in quoted:
        assert piece not in text, text


def test_a_text_file_is_told_what_a_safetensors_file_starts_with(tmp_path):
    path = tmp_path / "notes.safetensors"
    path.write_bytes(TEXT)
    with pytest.raises(SexpgpuError) as caught:
        load_parameter(str(path), "w", (1,), "model/w")
    assert "starts with the little-endian length of its JSON header" in caught.value.message


@pytest.mark.parametrize("content, quoted", [
    (b"password=hunter2\n", ["hunter2", "allow_pickle", "unsafely"]),
    (b"\x93NUMPY\x01\x00secret-npy", ["secret", str(int.from_bytes(b"se", "little"))]),
    (b"PK\x03\x04secret-zip-bytes", ["secret"]),
])
def test_a_record_file_that_is_not_npz_quotes_none_of_it(tmp_path, content, quoted):
    from sexpgpu.data.records import read_record_file

    path = tmp_path / "records.npz"
    path.write_bytes(content)
    with pytest.raises(SexpgpuError) as caught:
        read_record_file(str(path))
    text = caught.value.render()
    assert caught.value.code == "E-DATA-002" and "numpy.savez" in text
    for piece in quoted:
        assert piece not in text, text
