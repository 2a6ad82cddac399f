"""Parameters that start from a tensor in a safetensors file, and the pins that hold them still.

A `:load` source is a `.safetensors` file or a sharded checkpoint's
`model.safetensors.index.json`, whose `weight_map` names the shard holding each tensor;
either may be local or on S3. Loading reads only the header and the one tensor, and returns
a pin: the file read (the shard, for an index), the tensor, the file's size and its version,
the SHA-256 of a local file or the ETag of an S3 object as S3 gave it.

A resume re-reads the file named by the pin (or by the experiment, if it moved) with
`verify_load_pin`, and stops with E-LOAD-001 when the tensor, size or version differ.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass

import numpy as np

from sexpgpu.errors import SexpgpuError, did_you_mean
from sexpgpu.store import s3_objects, safetensors_io
from sexpgpu.store.checks import is_count
from sexpgpu.store.digests import CHUNK_BYTES, file_sha256
from sexpgpu.store.uris import MissingFile, is_s3, join, parent

MIB = 1024 * 1024
_WIDENS_EXACTLY = ("F32", "BF16", "F16")


@dataclass(frozen=True)
class LoadPin:
    param: str  # the parameter's path
    source: str  # the path the experiment named: a .safetensors file or an index
    file: str  # the file read: the shard, for an index
    tensor: str
    bytes: int
    version: str  # the SHA-256 of a local file, or an S3 object's ETag as S3 gave it
    version_kind: str  # "sha256" or "etag"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict) -> "LoadPin":
        """The pin a checkpoint recorded; ValueError unless it has every field with its type."""
        fields = cls.__dataclass_fields__
        if not isinstance(record, dict) or set(record) != set(fields):
            raise ValueError(f"a load pin needs exactly the keys {sorted(fields)}")
        if not all(isinstance(record[name], str) for name in fields if name != "bytes") or \
                not is_count(record["bytes"]) or record["version_kind"] not in ("sha256", "etag"):
            raise ValueError("a load pin holds strings, a byte count, and a version_kind of sha256 or etag")
        return cls(**record)


@dataclass(frozen=True)
class _Opened:
    """A safetensors file whose header has been read, and its version at that moment."""

    path: str
    header: safetensors_io.Header
    size: int
    version: str
    version_kind: str


def load_parameter(source: str, tensor: str | None, expected_shape, param_path: str,
                   dtype: str = "f32") -> tuple[np.ndarray, LoadPin]:
    """The float32 starting value of `param_path` from `source`, and the pin that records it.

    `tensor` defaults to the parameter's path. F32, BF16 and F16 tensors widen to float32
    exactly; a bf16 parameter also needs values that bf16 holds. Anything else is E-LOAD-002.
    """
    name = tensor or param_path
    file = _shard_for(source, name, param_path)
    opened = _open(file, param_path)
    entry = _entry(opened, name, param_path)
    if entry.shape != tuple(expected_shape):
        raise _load_error(param_path, f"tensor '{name}' in {file} has shape {list(entry.shape)}, "
                          f"but the parameter is declared {list(expected_shape)}")
    array = _as_float32(entry, _read_tensor(opened, entry, param_path), param_path, file, dtype)
    return array, LoadPin(param_path, source, file, name, opened.size, opened.version, opened.version_kind)


def verify_load_pin(pin: LoadPin | dict, source: str | None = None) -> LoadPin:
    """Check that the pinned file still holds what was read; return the pin as found now.

    `source` is where the experiment names the file today; when it moved, the same bytes at
    the new place pass, and the returned pin names the new place.
    """
    pin = LoadPin.from_json(pin) if isinstance(pin, dict) else pin
    file = pin.file if source is None else _shard_for(source, pin.tensor, pin.param)
    found = _open(file, pin.param)
    differences = []
    if pin.tensor not in found.header.entries:
        differences.append(f"tensor '{pin.tensor}' recorded, not in the file now")
    if found.size != pin.bytes:
        differences.append(f"size {pin.bytes} bytes recorded, {found.size} found")
    elif not _same_version(pin, found):
        differences.append(f"version {pin.version_kind} {pin.version} recorded, {found.version_kind} {found.version} found")
    if differences:
        raise SexpgpuError("E-LOAD-001", f"the weights loaded into '{pin.param}' changed: {pin.file} was read, "
                           f"{file} is there now; {'; '.join(differences)}.",
                           hint="Put the original file back, or start a new run from the new weights.")
    return LoadPin(pin.param, source or pin.source, file, pin.tensor, found.size, found.version, found.version_kind)


def _load_error(param: str, what: str, hint: str | None = None) -> SexpgpuError:
    return SexpgpuError("E-LOAD-002", f"cannot load parameter '{param}': {what}.", hint=hint)


def _shard_for(source: str, name: str, param: str) -> str:
    """The file that holds tensor `name`: `source` itself, or the shard an index maps it to."""
    if not source.endswith(".json"):
        return source
    try:
        index = json.loads(_read_small(source))
        weight_map = index["weight_map"]
        assert isinstance(weight_map, dict)
    except MissingFile:
        raise _load_error(param, f"there is no file {source}") from None
    except (ValueError, KeyError, TypeError, AssertionError):
        raise _load_error(param, f"{source} is not a safetensors index: it needs a \"weight_map\" object") from None
    if name not in weight_map:
        raise _load_error(param, f"the index {source} maps no tensor '{name}'", did_you_mean(name, weight_map))
    return join(parent(source), weight_map[name]) if is_s3(source) else os.path.join(os.path.dirname(source), weight_map[name])


def _read_small(path: str) -> bytes:
    if is_s3(path):
        return s3_objects.get_bytes(path, "reading")
    try:
        with open(path, "rb") as file:
            return file.read()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise MissingFile(path) from None


def _open(path: str, param: str) -> _Opened:
    try:
        return _open_s3(path) if is_s3(path) else _open_local(path)
    except MissingFile:
        raise _load_error(param, f"there is no file {path}") from None
    except safetensors_io.SafetensorsFormatError as error:
        raise _load_error(param, f"{path} is not a valid safetensors file: {error}") from None


def _open_local(path: str) -> _Opened:
    try:
        with open(path, "rb") as file:
            first = file.read(8)
            length = int.from_bytes(first, "little") if len(first) == 8 else 0
            head = first + file.read(min(length, safetensors_io.MAX_HEADER_BYTES))
            size = os.fstat(file.fileno()).st_size
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise MissingFile(path) from None
    header = safetensors_io.parse_header(head, size)
    return _Opened(path, header, size, _local_sha256(path), "sha256")


def _open_s3(path: str) -> _Opened:
    prefix, size, etag = s3_objects.get_range(path, 0, 8, "reading")
    length = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
    head, _, _ = s3_objects.get_range(path, 0, 8 + min(length, safetensors_io.MAX_HEADER_BYTES), "reading", etag)
    return _Opened(path, safetensors_io.parse_header(head, size), size, etag, "etag")


def _entry(opened: _Opened, name: str, param: str) -> safetensors_io.TensorEntry:
    if name not in opened.header.entries:
        raise _load_error(param, f"{opened.path} has no tensor '{name}'", did_you_mean(name, opened.header.entries))
    return opened.header.entries[name]


def _read_tensor(opened: _Opened, entry: safetensors_io.TensorEntry, param: str) -> bytes | bytearray:
    start, stop = opened.header.data_start + entry.begin, opened.header.data_start + entry.end
    if is_s3(opened.path):
        try:
            return s3_objects.get_range(opened.path, start, stop, "reading", opened.version)[0]
        except s3_objects.ObjectChanged:
            raise SexpgpuError("E-LOAD-001", f"{opened.path} was replaced while '{param}' was read from it.") from None
    data = bytearray(stop - start)
    with open(opened.path, "rb") as file:
        file.seek(start)
        count = file.readinto(data)
    if count != len(data) or _local_sha256(opened.path) != opened.version:
        raise SexpgpuError("E-LOAD-001", f"{opened.path} changed while '{param}' was read from it.")
    return data


def _as_float32(entry, data, param: str, file: str, dtype: str) -> np.ndarray:
    if entry.dtype not in _WIDENS_EXACTLY:
        raise _load_error(param, f"tensor '{entry.name}' in {file} is {entry.dtype}; a parameter loads only "
                          f"from {', '.join(_WIDENS_EXACTLY)}, which widen to float32 without rounding")
    array = np.array(safetensors_io.decode(entry, data), dtype=np.float32)
    if dtype == "bf16" and np.any(array.view(np.uint32) & 0xFFFF):
        raise _load_error(param, f"tensor '{entry.name}' in {file} is {entry.dtype} with values bf16 cannot hold; "
                          "the parameter is bf16 and a load never rounds")
    return array


_sha256_cache: dict[tuple, str] = {}


def _local_sha256(path: str) -> str:
    """The file's SHA-256, remembered while its size, times and inode stay the same."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    if key not in _sha256_cache:
        _sha256_cache[key] = file_sha256(path)[0]
    return _sha256_cache[key]


def _same_version(pin: LoadPin, found: _Opened) -> bool:
    """Whether the file found holds the pinned bytes, also when it moved between disk and S3."""
    if pin.version_kind == found.version_kind:
        return pin.version == found.version
    if pin.version_kind == "sha256":  # pinned on disk, found on S3: hash the object
        return s3_objects.get_object(found.path, "reading", s3_objects.TransferSettings.from_env())[2] == pin.version
    return _local_file_has_etag(found.path, pin.version, found.size)


def _local_file_has_etag(path: str, etag: str, size: int) -> bool:
    """Whether S3 would give a local file this ETag: the MD5 of a single-part upload, or for a
    multipart one the MD5 of its parts' MD5s, trying part sizes of whole MiB that give as many
    parts as the ETag says (S3 does not record the part size)."""
    digest, _, count = etag.strip('"').partition("-")
    if not count:
        return _part_md5s(path, max(size, 1))[0].hex() == digest
    parts = int(count)
    low = max(-(-size // (parts * MIB)), 1)
    sizes = [p * MIB for p in range(low, low + 64) if -(-size // (p * MIB)) == parts][:4]
    return any(hashlib.md5(b"".join(_part_md5s(path, p))).hexdigest() == digest for p in sizes)


def _part_md5s(path: str, part_size: int) -> list[bytes]:
    """The MD5 of each `part_size` piece of a file, in order."""
    digests = []
    with open(path, "rb") as file:
        while True:
            part, got = hashlib.md5(), 0
            while got < part_size:
                block = file.read(min(part_size - got, CHUNK_BYTES))
                if not block:
                    break
                part.update(block)
                got += len(block)
            if got == 0 and digests:
                return digests
            digests.append(part.digest())
            if got < part_size:
                return digests
