"""Data sources: a pure function of the global record index."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from sexpgpu.data.corpus import corpus_bytes
from sexpgpu.data.sources import RecordSource, TextSource, record_indices
from sexpgpu.errors import SexpgpuError
from sexpgpu import numerics as nx


def test_unshuffled_indices_wrap_in_order():
    assert record_indices(8, 5, 10).tolist() == [8, 9, 0, 1, 2]


def test_shuffled_epochs_are_permutations_that_differ():
    key = nx.stream_key(1, "data/shuffle")
    first = record_indices(0, 10, 10, key)
    second = record_indices(10, 10, 10, key)
    assert sorted(first.tolist()) == list(range(10)) == sorted(second.tolist())
    assert first.tolist() != second.tolist()
    # Reading one epoch in two pieces gives the same records as reading it whole.
    assert np.array_equal(np.concatenate([record_indices(0, 4, 10, key), record_indices(4, 6, 10, key)]), first)


def test_record_file_fields_and_batches(tmp_path):
    path = tmp_path / "r.npz"
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.arange(6, dtype=np.int32)
    np.savez(path, x=x, y=y)
    source = RecordSource(str(path), shuffle=False, seed=0)
    assert source.fields["x"].shape == (2,) and source.fields["x"].dtype == "f32"
    assert source.fields["y"].shape == () and source.fields["y"].dtype == "i32"
    batch = source.batch(4, 4)
    assert batch["y"].tolist() == [4, 5, 0, 1]
    assert np.array_equal(batch["x"][0], x[4])


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.zeros((3, 2), np.float32), "y": np.zeros(4, np.int32)}, "different numbers of records"),
    ({"x": np.zeros((3, 2), np.float64)}, "float64"),
    ({"x": np.float32(1)}, "scalar"),
    ({"x": np.zeros((10, 0), np.float32), "y": np.zeros(10, np.int32)}, "shape (10, 0): an axis of size 0"),
    ({"x": np.zeros((0, 2), np.float32)}, "holds no records"),
    ({"x": np.array([None, {}], dtype=object)}, "dtype object"),
])
def test_bad_record_files_are_refused(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(SexpgpuError) as error:
        RecordSource(str(path), shuffle=False, seed=0)
    assert error.value.code == "E-DATA-002" and message in error.value.message


def _npz(members) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members:
            archive.writestr(name, data)
    return out.getvalue()


def _npy(array: np.ndarray, shape=None) -> bytes:
    """An .npy file of the array, its header declaring `shape` instead of the array's."""
    header = {"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False,
              "shape": array.shape if shape is None else shape}
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + array.tobytes()


@pytest.mark.parametrize("content, message", [
    (b"", "not a readable .npz file"),
    (_npz([]), "holds no tensors"),
    (_npz([("x.npy", _npy(np.zeros((3, 2), np.float32))), ("readme.txt", b"hi")]), "'readme.txt', which is not an .npy"),
    (_npz([("x.npy", _npy(np.zeros((3, 2), np.float32), shape=(2**40, 2)))]),
     "declares shape (1099511627776, 2) of float32, 8796093022208 bytes, and holds 24"),
    (_npy(np.zeros((3, 2), np.float32)), "not a readable .npz file"),  # an .npy, not an archive of them
], ids=["empty", "no-members", "other-member", "huge-shape", "npy-not-npz"])
def test_damaged_npz_files_are_refused_before_their_data_is_read(tmp_path, content, message):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(SexpgpuError) as error:
        RecordSource(str(path), shuffle=False, seed=0)
    assert error.value.code == "E-DATA-002" and message in error.value.message


def test_fortran_order_and_big_endian_fields_read_as_numpy_does(tmp_path):
    path = tmp_path / "r.npz"
    x = np.asfortranarray(np.arange(12, dtype=">f4").reshape(6, 2))
    np.savez(path, x=x, y=np.arange(6, dtype=">i4"))
    source = RecordSource(str(path), shuffle=False, seed=0)
    assert source.fields["x"].dtype == "f32" and source.fields["y"].dtype == "i32"
    assert np.array_equal(source.batch(0, 6)["x"], np.load(path)["x"]) and source.batch(0, 6)["x"].dtype == np.float32


def test_missing_record_file(tmp_path):
    with pytest.raises(SexpgpuError) as error:
        RecordSource(str(tmp_path / "none.npz"), shuffle=False, seed=0)
    assert error.value.code == "E-DATA-001"


def test_text_records_are_shifted_windows_of_the_corpus():
    source = TextSource("pydoc", 8)
    batch = source.batch(3, 2)
    text = corpus_bytes("pydoc")
    start = 3 * 8
    assert batch["x"][0].tolist() == text[start:start + 8].tolist()
    assert batch["y"][0].tolist() == text[start + 1:start + 9].tolist()
    assert batch["x"].dtype == np.int32


def test_unknown_corpus():
    with pytest.raises(SexpgpuError) as error:
        TextSource("wikipedia", 8)
    assert error.value.code == "E-DATA-003"


def test_the_committed_spirals_are_what_their_script_draws():
    """Golden data: the example's records come from the portable draws, so a change in the
    draws' bits shows here, as jax.random's golden values do."""
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "examples" / "data"
    sys.path.insert(0, str(folder))
    try:
        import make_spirals
    finally:
        sys.path.remove(str(folder))
    x, y = make_spirals.spirals()
    with np.load(folder / "spirals.npz") as committed:
        assert np.array_equal(committed["x"].view(np.uint32), x.view(np.uint32))
        assert np.array_equal(committed["y"], y)
