"""Record files: a `.safetensors` or `.npz` file in which every tensor is a field and its
first axis indexes records. All fields must have the same number of records."""

from __future__ import annotations

import zipfile

import numpy as np

from sexpgpu.errors import SexpgpuError
from sexpgpu.store import safetensors_io

_DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32"}


def read_record_file(path: str) -> dict[str, np.ndarray]:
    """Every field of a record file, checked: float32 or int32, one shared record count."""
    fields = _read_tensors(path)
    if not fields:
        raise SexpgpuError("E-DATA-002", f"the record file '{path}' holds no tensors: expected one tensor per field.")
    counts = {}
    for name, array in fields.items():
        if array.ndim == 0:
            raise SexpgpuError("E-DATA-002", f"field '{name}' of '{path}' is a scalar: its first axis must index records.")
        if array.dtype not in _DTYPES:
            raise SexpgpuError(
                "E-DATA-002",
                f"field '{name}' of '{path}' has dtype {array.dtype}: expected float32 or int32.",
            )
        counts[name] = array.shape[0]
    if len(set(counts.values())) != 1:
        listing = ", ".join(f"{name}: {count}" for name, count in sorted(counts.items()))
        raise SexpgpuError("E-DATA-002", f"the fields of '{path}' hold different numbers of records ({listing}).")
    if next(iter(counts.values())) == 0:
        raise SexpgpuError("E-DATA-002", f"the record file '{path}' holds no records.")
    return {name: np.ascontiguousarray(fields[name]) for name in sorted(fields)}


def dtype_name(array: np.ndarray) -> str:
    return _DTYPES[array.dtype]


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    try:
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        if path.endswith(".safetensors"):
            with open(path, "rb") as file:
                data = file.read()
            return safetensors_io.decode_all(safetensors_io.parse_header(data, len(data)), data)
    except FileNotFoundError:
        raise SexpgpuError("E-DATA-001", f"no record file at '{path}'.") from None
    except safetensors_io.SafetensorsFormatError as error:
        raise SexpgpuError("E-DATA-002", f"'{path}' is not a valid safetensors file: {error}.") from None
    except (ValueError, zipfile.BadZipFile):
        # numpy's own messages quote the file's header, or advise loading pickles unsafely
        raise SexpgpuError("E-DATA-002", f"'{path}' is not a readable .npz file: expected a zip archive of "
                           ".npy arrays as numpy.savez writes it, with no pickled objects.") from None
    except OSError as error:
        raise SexpgpuError("E-DATA-002", f"cannot read the record file '{path}': {error.strerror or error}.") from None
    raise SexpgpuError("E-DATA-002", f"'{path}' is not a record file: expected a .safetensors or .npz file.")
