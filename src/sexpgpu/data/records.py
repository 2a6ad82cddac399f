"""Record files: a `.safetensors` or `.npz` file in which every tensor is a field and its
first axis indexes records. All fields must have the same number of records.

An `.npz` is read member by member with zipfile and numpy's header readers rather than
`numpy.load`: each header is checked (dtype, and that its shape's bytes are what the member
holds) before any data is read, so a damaged or hostile file is refused with E-DATA-002
instead of allocating what its header claims, unpickling objects, or failing inside numpy.
"""

from __future__ import annotations

import lzma
import math
import os
import zipfile
import zlib

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.store import safetensors_io

_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32"}
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
# What zipfile and its decompressors raise for an archive that is not one, or is damaged:
# no central directory, a bad CRC, a corrupt deflate/bzip2/lzma stream, a stream that ends
# early, a compression method or zip version it does not read.
_DAMAGED_ARCHIVE = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, NotImplementedError, ValueError,
                    OverflowError)
_ENCRYPTED = 0x1  # bit 0 of a zip member's flags


def read_record_file(path: str) -> dict[str, np.ndarray]:
    """Every field of a record file, checked: float32 or int32, one shared record count, and
    at least one value a record."""
    fields = _read_tensors(path)
    if not fields:
        raise SexpgpuError("E-DATA-002", f"the record file '{path}' holds no tensors: expected one tensor per field.")
    for name, array in fields.items():
        if array.ndim == 0:
            raise SexpgpuError("E-DATA-002", f"field '{name}' of '{path}' is a scalar: its first axis must index records.")
        _check_dtype(path, name, array.dtype)
    counts = {name: array.shape[0] for name, array in fields.items()}
    if len(set(counts.values())) != 1:
        listing = ", ".join(f"{name}: {count}" for name, count in sorted(counts.items()))
        raise SexpgpuError("E-DATA-002", f"the fields of '{path}' hold different numbers of records ({listing}).")
    if next(iter(counts.values())) == 0:
        raise SexpgpuError("E-DATA-002", f"the record file '{path}' holds no records.")
    for name, array in fields.items():
        if 0 in array.shape[1:]:
            raise SexpgpuError("E-DATA-002", f"field '{name}' of '{path}' has shape {array.shape}: an axis of size 0 "
                                             "leaves each record without values.")
    return {name: _native(np.ascontiguousarray(fields[name])) for name in sorted(fields)}


def dtype_name(array: np.ndarray) -> str:
    return _DTYPES[array.dtype]


def _check_dtype(path: str, name: str, dtype: np.dtype) -> None:
    """float32 or int32, in either byte order."""
    if dtype.newbyteorder("=") not in _DTYPES:
        raise SexpgpuError("E-DATA-002", f"field '{name}' of '{path}' has dtype {dtype}: expected float32 or int32.")


def _native(array: np.ndarray) -> np.ndarray:
    """The array in this machine's byte order (a file may hold big-endian numbers)."""
    return array if array.dtype in _DTYPES else array.astype(array.dtype.newbyteorder("="))


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    try:
        if path.endswith(".npz"):
            return _read_npz(path)
        if path.endswith(".safetensors"):
            with open(path, "rb") as file:
                data = file.read()
            return safetensors_io.decode_all(safetensors_io.parse_header(data, len(data)), data)
    except FileNotFoundError:
        raise SexpgpuError("E-DATA-001", f"no record file at '{path}'.") from None
    except safetensors_io.SafetensorsFormatError as error:
        raise SexpgpuError("E-DATA-002", f"'{path}' is not a valid safetensors file: {error}.") from None
    except _DAMAGED_ARCHIVE:
        # the messages of zipfile and numpy quote the file's bytes
        raise SexpgpuError("E-DATA-002", f"'{path}' is not a readable .npz file: expected a zip archive of "
                           ".npy arrays as numpy.savez writes it, with no pickled objects.") from None
    except OSError as error:
        raise SexpgpuError("E-DATA-002", f"cannot read the record file '{path}': {error.strerror or error}.") from None
    raise SexpgpuError("E-DATA-002", f"'{path}' is not a record file: expected a .safetensors or .npz file.")


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """The fields of an .npz: one `<field>.npy` member each, as numpy.savez writes them."""
    with open(path, "rb") as file:  # an OSError here is the file's: missing, unreadable
        try:
            return _read_archive(path, file, os.fstat(file.fileno()).st_size)
        except OSError:  # one from inside the archive is its damage: bz2 reports a corrupt stream so
            raise zipfile.BadZipFile from None


def _read_archive(path: str, file, size: int) -> dict[str, np.ndarray]:
    fields = {}
    with zipfile.ZipFile(file) as archive:
        for member in archive.infolist():
            name = _field_name(path, member)
            if name in fields:
                raise SexpgpuError("E-DATA-002", f"'{path}' holds field '{name}' twice.")
            if member.compress_size > size:  # a directory that claims more than the file holds
                raise zipfile.BadZipFile
            fields[name] = _read_npy(path, name, archive, member)
    return fields


def _field_name(path: str, member: zipfile.ZipInfo) -> str:
    if not member.filename.endswith(".npy"):
        raise SexpgpuError("E-DATA-002", f"'{path}' holds '{member.filename}', which is not an .npy array: expected "
                                         "one <field>.npy member per field, as numpy.savez writes them.")
    if member.flag_bits & _ENCRYPTED:
        raise SexpgpuError("E-DATA-002", f"'{path}' holds '{member.filename}' encrypted: expected the arrays as "
                                         "numpy.savez writes them.")
    return member.filename[:-len(".npy")]


def _read_npy(path: str, name: str, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> np.ndarray:
    """One member's array. Its header is read and checked first: a dtype other than float32
    or int32 (an object array among them) is refused unread, and so is a shape that declares
    other than the bytes the member holds."""
    with archive.open(member) as stream:
        reader = _HEADER_READERS.get(np.lib.format.read_magic(stream))
        if reader is None:
            raise SexpgpuError("E-DATA-002", f"field '{name}' of '{path}' is an .npy array of a format other than "
                                             "1.0 and 2.0, which hold float32 and int32 arrays.")
        shape, fortran_order, dtype = reader(stream)
        _check_dtype(path, name, dtype)
        expected = math.prod(shape) * dtype.itemsize
        held = member.file_size - stream.tell()
        if min(shape, default=0) < 0 or expected != held:
            raise SexpgpuError("E-DATA-002", f"field '{name}' of '{path}' declares shape {shape} of {dtype}, "
                                             f"{expected} bytes, and holds {held}: the file is damaged.")
        data = stream.read(expected)
    if len(data) != expected:
        raise EOFError
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran_order else "C")
