"""Malformed and edge-case record files: the fuzzer's data inputs.

A record case is tiny-adam, shrunk to two steps, reading `case.npz`, and that file made by one
named maker from the case's random stream: a few bytes or none, a truncated or corrupted
archive, a zip of other things than .npy arrays, pickled objects, zero-size axes, dtypes other
than float32 and int32, fields with different record counts, npy headers that declare more
than the file holds, non-finite values, Fortran order, odd field names and ranks. Each case
runs `sexpgpu check` and then `sexpgpu run` for two steps, and must meet the contract of
fuzz_harness.py. Case 4711 is the same file on every machine.
"""

from __future__ import annotations

import io
import random
import re
import struct
import warnings
import zipfile
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fuzz_mutators import Case, Plan

RECORD_FILE = "case.npz"
SEED = "tiny-adam"
COUNTS = (1, 2, 3, 7, 8, 64, 200)  # record counts: fewer than a batch of 8, one batch, several
CLASSES = 3
ODD_DTYPES = ("complex64", "complex128", "<U3", "S3", "float16", "bool", "int8", "uint8", "int64", "uint32",
              "float64", ">f4", ">i4", "datetime64[s]", "timedelta64[ms]", "V4", [("a", "<f4")],
              [("a", "<f4"), ("b", "<i4")], "<f4,(2,)<f4")
HUGE_DIMS = (2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**64, 10**30)
ODD_NAMES = ("", "x\x1b[31m", "../x", "x/y", "ü", "\u202ex", "x" * 300, " x", "x.npy", "X")
COMPRESSIONS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


def record_text(seed_text: str) -> str:
    """The seed (a shrunk tiny-adam) reading the case's record file, and writing no checkpoint:
    the case is about the data, and a checkpoint costs more than the two steps."""
    return re.sub(r"\s*:checkpoint \d+", "", seed_text.replace('"data/spirals.npz"', f'"{RECORD_FILE}"'))


# -- writing --------------------------------------------------------------------------------

def base_fields(rng: random.Random) -> dict[str, np.ndarray]:
    """tiny-adam's fields: x, two floats a record, and y, a class."""
    count = rng.choice(COUNTS)
    x = np.asarray([[rng.gauss(0, 1), rng.gauss(0, 1)] for _ in range(count)], dtype=np.float32)
    y = np.asarray([rng.randrange(CLASSES) for _ in range(count)], dtype=np.int32)
    return {"x": x, "y": y}


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, array, allow_pickle=True)
    return out.getvalue()


def npy_with_header(header: str, data: bytes, version: tuple[int, int] = (1, 0)) -> bytes:
    """An .npy file with `header` as its dictionary, padded as numpy pads it."""
    raw = header.encode("latin1")
    length_format = "<H" if version == (1, 0) else "<I"
    prefix = 6 + 2 + struct.calcsize(length_format)
    padded = raw + b" " * ((-(prefix + len(raw) + 1)) % 64) + b"\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack(length_format, len(padded)) + padded + data


def zip_bytes(members, compression: int = zipfile.ZIP_STORED) -> bytes:
    """A zip archive of (name, bytes) members, duplicates kept; dated 1980-01-01, so that the
    bytes are a function of the case (writestr dates a member by the clock)."""
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name, which is the point
        with zipfile.ZipFile(out, "w", compression) as archive:
            for name, data in members:
                member = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                member.compress_type = compression
                archive.writestr(member, data)
    return out.getvalue()


def npz_bytes(fields: dict, compression: int = zipfile.ZIP_STORED) -> bytes:
    """What numpy.savez writes: one `<name>.npy` member a field."""
    return zip_bytes([(f"{name}.npy", npy_bytes(array)) for name, array in fields.items()], compression)


def _header(descr: str, shape, fortran: bool = False) -> str:
    return f"{{'descr': {descr!r}, 'fortran_order': {fortran}, 'shape': {tuple(shape)!r}, }}"


def _field(rng) -> str:
    return rng.choice(("x", "y"))


# -- the makers ------------------------------------------------------------------------------

def empty(rng):
    return b""


def truncated(rng):
    data = npz_bytes(base_fields(rng), rng.choice(COMPRESSIONS))
    return data[:rng.randrange(len(data))]


def not_a_zip(rng):
    fields = base_fields(rng)
    return rng.choice((
        b"not a zip archive\n", bytes(rng.randrange(256) for _ in range(rng.choice((1, 4, 100, 5000)))),
        npy_bytes(fields["x"]),  # an .npy file, not an archive of them
        b"PK\x03\x04" + b"\x00" * 26, b"PK\x05\x06" + b"\x00" * 18,  # a local header alone; an empty directory
        b"\x1f\x8b\x08\x00" + b"\x00" * 20, b"{\"x\": [1, 2]}",
    ))


def byte_flip(rng):
    data = bytearray(npz_bytes(base_fields(rng), rng.choice(COMPRESSIONS)))
    for _ in range(rng.choice((1, 2, 8))):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def other_members(rng):
    """Members that are not .npy arrays, beside the fields or instead of them."""
    fields = base_fields(rng)
    members = [(f"{name}.npy", npy_bytes(array)) for name, array in fields.items() if rng.random() < 0.7]
    odd = rng.choice((("readme.txt", b"hello"), ("x", npy_bytes(fields["x"])), ("y.npy", b"not npy"),
                      ("dir/", b""), ("y.npy", b"\x93NUMPY"), ("x.npz", npz_bytes(fields)),
                      ("x.npy", b"\x93NUMPY\x01\x00\xff\xff{"), (".npy", npy_bytes(fields["y"]))))
    members.insert(rng.randrange(len(members) + 1), odd)
    return zip_bytes(members, rng.choice(COMPRESSIONS))


def no_members(rng):
    return zip_bytes([])


def duplicate_member(rng):
    fields = base_fields(rng)
    name = _field(rng)
    other = base_fields(rng)[name]
    return zip_bytes([*((f"{n}.npy", npy_bytes(a)) for n, a in fields.items()), (f"{name}.npy", npy_bytes(other))])


def bad_header(rng):
    """An .npy member whose header is not one numpy wrote."""
    fields = base_fields(rng)
    name = _field(rng)
    array = fields[name]
    data = array.tobytes()
    descr = np.lib.format.dtype_to_descr(array.dtype)
    member = rng.choice((
        npy_with_header(_header(descr, (-1,) + array.shape[1:]), data),
        npy_with_header(_header(descr, (array.shape[0], -2)), data),
        npy_with_header("{'descr': '<f4', 'shape': (3,)}", data),
        npy_with_header("{'descr': 'O', 'fortran_order': False, 'shape': (1,), }", data),
        npy_with_header("{'descr': '<zz', 'fortran_order': False, 'shape': (1,), }", data),
        npy_with_header("[1, 2, 3]", data),
        npy_with_header("{'descr': '<f4', 'fortran_order': 'yes', 'shape': (1,), }", data),
        npy_with_header(_header(descr, (1.5,)), data),
        npy_with_header(_header(descr, array.shape) + "#" * 70000, data, (2, 0)),
        npy_with_header(_header(descr, array.shape), data, (9, 9)),
        npy_with_header(_header(descr, array.shape), data, (3, 0)),
        b"\x93NUMPY\x01\x00" + struct.pack("<H", 65535) + b"{'descr'",
        b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**32 - 1) + b"{",
        npy_with_header("{" * 10000, data),
    ))
    fields_bytes = [(f"{n}.npy", npy_bytes(a)) for n, a in fields.items() if n != name] + [(f"{name}.npy", member)]
    return zip_bytes(fields_bytes)


def huge_shape(rng):
    """A header that declares far more than the member holds."""
    fields = base_fields(rng)
    name = _field(rng)
    array = fields[name]
    shape = list(array.shape)
    shape[rng.randrange(len(shape))] = rng.choice(HUGE_DIMS)
    if rng.random() < 0.3:
        shape.append(rng.choice(HUGE_DIMS))
    member = npy_with_header(_header(np.lib.format.dtype_to_descr(array.dtype), shape), array.tobytes())
    return zip_bytes([(f"{n}.npy", npy_bytes(a) if n != name else member) for n, a in fields.items()])


def objects(rng):
    fields = base_fields(rng)
    count = len(fields["y"])
    fields[_field(rng)] = rng.choice((np.array([{"a": 1}] * count, dtype=object),
                                      np.array([None] * count, dtype=object),
                                      np.array([[1.0, 2.0]] * count, dtype=object)))
    return npz_bytes(fields)


def zero_size(rng):
    fields = base_fields(rng)
    count = len(fields["y"])
    change = rng.choice(("x-no-values", "no-records", "x-third-axis", "y-no-values", "all-empty"))
    if change == "x-no-values":
        fields["x"] = np.zeros((count, 0), np.float32)
    elif change == "no-records":
        fields = {"x": np.zeros((0, 2), np.float32), "y": np.zeros((0,), np.int32)}
    elif change == "x-third-axis":
        fields["x"] = np.zeros((count, 2, 0), np.float32)
    elif change == "y-no-values":
        fields["y"] = np.zeros((count, 0), np.int32)
    else:
        fields = {"x": np.zeros((0, 0), np.float32), "y": np.zeros((0, 0), np.int32)}
    return npz_bytes(fields)


def odd_dtype(rng):
    fields = base_fields(rng)
    name = _field(rng)
    dtype = np.dtype(rng.choice(ODD_DTYPES))
    try:
        fields[name] = fields[name].astype(dtype)
    except (TypeError, ValueError):
        fields[name] = np.zeros(fields[name].shape, dtype)
    return npz_bytes(fields)


def swapped_dtypes(rng):
    """float32 and int32, but not where the model wants them."""
    fields = base_fields(rng)
    fields["x"], fields["y"] = fields["x"].astype(np.int32), fields["y"].astype(np.float32)
    if rng.random() < 0.5:
        del fields[rng.choice(("x", "y"))]
    return npz_bytes(fields)


def record_counts(rng):
    fields = base_fields(rng)
    name = _field(rng)
    count = max(0, len(fields[name]) + rng.choice((-1, 1, 5, -len(fields[name]))))
    fields[name] = np.resize(fields[name], (count,) + fields[name].shape[1:])
    return npz_bytes(fields)


def non_finite(rng):
    fields = base_fields(rng)
    x = fields["x"]
    value = rng.choice((np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45))
    if rng.random() < 0.5:
        x[...] = value
    else:
        x.flat[rng.randrange(x.size)] = value
    if rng.random() < 0.5:
        y = fields["y"]
        y.flat[rng.randrange(y.size)] = rng.choice((-1, CLASSES, 2**31 - 1, -2**31))
    return npz_bytes(fields)


def fortran_order(rng):
    fields = base_fields(rng)
    x = fields["x"]
    fields["x"] = np.asfortranarray(rng.choice((x, x.reshape(len(x), 2, 1), x.reshape(len(x), 1, 2))))
    return npz_bytes(fields)


def odd_rank(rng):
    fields = base_fields(rng)
    count = len(fields["y"])
    name = _field(rng)
    array = fields[name]
    fields[name] = rng.choice((array.reshape(-1)[:1].reshape(()), array.reshape(count, -1, 1),
                               array.reshape((count,) + (1,) * 7 + array.shape[1:]),
                               np.resize(array, (count, 2, 3)) if name == "y" else np.resize(array, (count,))))
    return npz_bytes(fields)


def odd_fields(rng):
    """Fields missing, renamed, many, or with names no graph can read."""
    fields = base_fields(rng)
    change = rng.choice(("missing", "renamed", "many", "extra"))
    if change == "missing":
        del fields[_field(rng)]
    elif change == "renamed":
        fields[rng.choice(ODD_NAMES)] = fields.pop(_field(rng))
    elif change == "many":
        count = len(fields["y"])
        for k in range(rng.choice((10, 300))):
            fields[f"f{k}"] = np.zeros((count,), np.float32)
    else:
        fields[rng.choice(ODD_NAMES) or "z"] = np.zeros((len(fields["y"]), rng.choice((0, 1, 5))), np.int32)
    return npz_bytes(fields)


def compressed(rng):
    """A well-formed archive with compressed members; now and then one corrupted inside."""
    data = bytearray(npz_bytes(base_fields(rng), rng.choice(COMPRESSIONS[1:])))
    if rng.random() < 0.5:
        at = rng.randrange(30, max(31, len(data) // 2))
        data[at:at + 4] = bytes(rng.randrange(256) for _ in range(4))
    return bytes(data)


def encrypted(rng):
    """A member flagged as encrypted, which no reader here can open."""
    data = bytearray(npz_bytes(base_fields(rng)))
    data[6] |= 0x1  # the local header's flag
    directory = data.rfind(b"PK\x01\x02")
    data[directory + 8] |= 0x1  # the central directory's
    return bytes(data)


@dataclass(frozen=True)
class RecordMaker:
    name: str
    make: Callable[[random.Random], bytes]


RECORD_MAKERS = tuple(RecordMaker(function.__name__.replace("_", "-"), function) for function in (
    empty, truncated, not_a_zip, byte_flip, other_members, no_members, duplicate_member, bad_header, huge_shape,
    objects, zero_size, odd_dtype, swapped_dtypes, record_counts, non_finite, fortran_order, odd_rank, odd_fields,
    compressed, encrypted,
))


def make_record_case(index: int, seeds, runnable, plan: Plan = Plan()) -> Case:
    """Case `index` of the record kind: the makers in turn, each file from the case's stream."""
    rng = random.Random(f"{plan.seed}:records:{index}")
    maker = RECORD_MAKERS[index % len(RECORD_MAKERS)]
    seed = next(s for s in runnable if s.name == SEED)
    return Case(index, "run", SEED, (maker.name,), record_text(seed.text), files=((RECORD_FILE, maker.make(rng)),))
