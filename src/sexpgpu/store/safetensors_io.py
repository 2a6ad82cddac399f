"""The safetensors format, written and read without the `safetensors` package.

A file is: an 8-byte little-endian header length N; N bytes of UTF-8 JSON (an object mapping
each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, and optionally
"__metadata__" mapping strings to strings), padded with spaces; then the tensors' bytes,
little-endian and C-ordered, contiguous, with no holes, offsets counted from the end of the
header.

We write tensors in order of descending item size, then name, and pad the header to a
multiple of 8 bytes, so every tensor starts aligned to its own item size.

bf16 has no numpy dtype. The interpreter keeps a bf16 value as a float32 whose low 16 bits
are zero, so a tensor named as bf16 is written as the high halves of its float32 words and
read back into float32 the same way: the round trip keeps every bit.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import numpy as np

MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype name -> numpy dtype of its stored bytes (little-endian).
STORED_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
}

# (numpy kind, item size) -> safetensors dtype name, whatever the array's byte order; BF16 is
# stored as U16's bytes and is asked for by name.
_NAME_OF_NUMPY_KIND = {(dtype.kind, dtype.itemsize): name for name, dtype in STORED_DTYPES.items() if name != "BF16"}


class SafetensorsFormatError(ValueError):
    """The bytes are not a valid safetensors file; the message says which rule they break."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A parsed header. `data_start` is the file offset of the first tensor byte."""

    entries: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int

    @property
    def file_bytes(self) -> int:
        return self.data_start + max((e.end for e in self.entries.values()), default=0)


@dataclass(frozen=True)
class Encoded:
    """A file ready to write: `buffers` concatenated are the file's bytes."""

    buffers: list[memoryview]
    nbytes: int


def encode(tensors: dict[str, np.ndarray], bf16=(), metadata: dict[str, str] | None = None) -> Encoded:
    """Lay out `tensors` as a safetensors file without copying their bytes where possible.

    Names in `bf16` must be float32 arrays whose low 16 bits are zero; they are stored as BF16.
    """
    bf16 = set(bf16)
    unknown = sorted(bf16 - set(tensors))
    if unknown:
        raise ValueError(f"bf16 names tensors that are not given: {unknown}")
    stored = {name: _stored_form(name, array, name in bf16) for name, array in tensors.items()}
    order = sorted(stored, key=lambda name: (-stored[name][1].itemsize, name))
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    offset = 0
    for name in order:
        dtype_name, array = stored[name]
        header[name] = {"dtype": dtype_name, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    buffers = [memoryview(struct.pack("<Q", len(text)) + text)]
    buffers += [_bytes_of(stored[name][1]) for name in order if stored[name][1].nbytes]
    return Encoded(buffers, 8 + len(text) + offset)


def _stored_form(name: str, array: np.ndarray, as_bf16: bool) -> tuple[str, np.ndarray]:
    array = np.asarray(array)
    if as_bf16:
        if array.dtype != np.float32:
            raise ValueError(f"tensor '{name}' is named bf16 but is {array.dtype}, not float32")
        words = array.astype(np.float32, order="C", copy=False).view(np.uint32)
        if np.any(words & 0xFFFF):
            raise ValueError(f"tensor '{name}' is named bf16 but has float32 values that bf16 cannot hold")
        return "BF16", (words >> 16).astype("<u2")
    name_of = _NAME_OF_NUMPY_KIND.get((array.dtype.kind, array.dtype.itemsize))
    if name_of is None:
        raise ValueError(f"tensor '{name}' has dtype {array.dtype}, which a checkpoint does not store")
    # astype, not ascontiguousarray, which would turn a 0-d array into a 1-d one.
    return name_of, array.astype(STORED_DTYPES[name_of], order="C", copy=False)


def _bytes_of(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1)).cast("B")


def parse_header(prefix: bytes | bytearray | memoryview, file_bytes: int | None = None) -> Header:
    """Parse and validate a header from the file's first bytes (at least 8 + N of them).

    With `file_bytes`, also check that the tensors cover the rest of the file exactly.
    """
    if len(prefix) < 8:
        raise SafetensorsFormatError(f"file is {len(prefix)} bytes, shorter than the 8-byte header length")
    # Messages describe the bytes, never quote them: a file that is not safetensors at all
    # would otherwise have its first bytes echoed back as a "length".
    (length,) = struct.unpack("<Q", bytes(prefix[:8]))
    if length > MAX_HEADER_BYTES:
        raise SafetensorsFormatError(
            f"its first 8 bytes are not a header length of at most {MAX_HEADER_BYTES // 2**20} MiB, as a "
            f"safetensors file starts with the little-endian length of its JSON header; the value is over the limit")
    if len(prefix) < 8 + length:
        raise SafetensorsFormatError(f"the header length in its first 8 bytes goes past the end: the file ends "
                                     f"{len(prefix) - 8} bytes after them")
    try:
        header = json.loads(bytes(prefix[8 : 8 + length]).decode("utf-8"))
    except UnicodeDecodeError as error:
        raise SafetensorsFormatError(f"header is not UTF-8 JSON: byte {error.start} of it is not UTF-8") from None
    except json.JSONDecodeError as error:
        raise SafetensorsFormatError(f"header is not UTF-8 JSON: {error.msg} at byte {error.pos} of it") from None
    except (ValueError, RecursionError):  # an integer of thousands of digits, or nesting too deep
        raise SafetensorsFormatError("header is not JSON that a safetensors reader accepts") from None
    if not isinstance(header, dict):
        raise SafetensorsFormatError("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsFormatError("__metadata__ must map strings to strings")
    entries = {name: _entry(name, spec) for name, spec in header.items()}
    _check_contiguous(entries)
    parsed = Header(entries, metadata, 8 + length)
    if file_bytes is not None and parsed.file_bytes != file_bytes:
        raise SafetensorsFormatError(f"tensors end at byte {parsed.file_bytes} but the file has {file_bytes} bytes")
    return parsed


def _entry(name: str, spec) -> TensorEntry:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsFormatError(f"tensor '{name}' needs exactly dtype, shape and data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dtype, str) or dtype not in STORED_DTYPES:
        raise SafetensorsFormatError(f"tensor '{name}' has a dtype that is not one of {', '.join(STORED_DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise SafetensorsFormatError(f"tensor '{name}' has a shape that is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)):
        raise SafetensorsFormatError(f"tensor '{name}' has data_offsets that are not two non-negative integers")
    begin, end = offsets
    expected = math.prod(shape) * STORED_DTYPES[dtype].itemsize
    if end - begin != expected:
        raise SafetensorsFormatError(f"tensor '{name}' spans {end - begin} bytes but {dtype} {shape} needs {expected}")
    return TensorEntry(name, dtype, tuple(shape), begin, end)


def _check_contiguous(entries: dict[str, TensorEntry]) -> None:
    position = 0
    for entry in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if entry.begin != position:
            raise SafetensorsFormatError(f"tensor '{entry.name}' starts at {entry.begin}, not at {position}: a hole or overlap")
        position = entry.end


def decode(entry: TensorEntry, data: bytes | bytearray | memoryview) -> np.ndarray:
    """The tensor from its own bytes: BF16 widens to float32, everything else keeps its dtype.

    The array shares `data` when no conversion is needed.
    """
    stored = np.frombuffer(data, dtype=STORED_DTYPES[entry.dtype]).reshape(entry.shape)
    if entry.dtype == "BF16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(stored.dtype.newbyteorder("="), copy=False)


def decode_all(header: Header, data: bytes | bytearray | memoryview) -> dict[str, np.ndarray]:
    """Every tensor of a whole file's bytes, in the header's name order."""
    view = memoryview(data)
    return {
        name: decode(entry, view[header.data_start + entry.begin : header.data_start + entry.end])
        for name, entry in sorted(header.entries.items())
    }
