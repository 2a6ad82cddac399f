"""The generated-kernel cache imports only what this process generated, from a private folder.

Importing a cached kernel runs it, so whoever can write the cache could run code in the next
CUDA run. These tests plant files as such a writer would and check that none is imported.
They need no GPU: a "kernel" here is any module source with a `kernel` function.
"""

from __future__ import annotations

import hashlib
import os
import stat
import uuid

import pytest

from sexpgpu.backends.cuda.codegen import compile as kernels


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh home folder and temporary folder, and no kernel remembered from earlier tests."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(kernels.tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(kernels, "_fallback_folder", [], raising=False)
    return tmp_path / "home"


def genuine_source() -> str:
    return f"# {uuid.uuid4().hex}\ndef kernel():\n    return 'genuine'\n"


def planted_path(folder, source: str):
    return folder / f"k_{hashlib.sha256(source.encode()).hexdigest()[:24]}.py"


def plant(folder, source: str, mode: int = 0o700):
    folder.mkdir(parents=True, exist_ok=True)
    planted_path(folder, source).write_text("def kernel():\n    return 'tampered'\n")
    folder.chmod(mode)


def test_a_tampered_cached_kernel_is_replaced_not_imported(home):
    source = genuine_source()
    folder = home / ".cache" / "sexpgpu" / "kernels"
    plant(folder, source)
    assert kernels.load_kernel(source)() == "genuine"
    assert planted_path(folder, source).read_text() == source


def test_an_intact_cached_kernel_is_used_as_it_is(home):
    source = genuine_source()
    folder = home / ".cache" / "sexpgpu" / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    planted_path(folder, source).write_text(source)
    before = os.stat(planted_path(folder, source))
    assert kernels.load_kernel(source)() == "genuine"
    after = os.stat(planted_path(folder, source))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_cache_folder_others_can_write_is_refused(home, mode):
    source = genuine_source()
    folder = home / ".cache" / "sexpgpu" / "kernels"
    plant(folder, source, mode)
    assert kernels.load_kernel(source)() == "genuine"
    used = kernels.kernel_folder()
    assert os.path.realpath(used) != os.path.realpath(folder)
    assert_private(used)


def test_a_new_cache_folder_is_made_private(home):
    folder = kernels.kernel_folder()
    assert folder == str(home / ".cache" / "sexpgpu" / "kernels")
    assert_private(folder)
    assert_private(os.path.dirname(folder))


def test_without_a_usable_home_the_fallback_is_fresh_and_private(home, tmp_path, monkeypatch):
    source = genuine_source()
    monkeypatch.setenv("HOME", str(tmp_path / "not-a-folder"))
    (tmp_path / "not-a-folder").write_text("a file where the home folder should be")
    # Someone else made the old predictable fallback first and planted a kernel in it.
    predictable = tmp_path / "tmp" / f"sexpgpu-kernels-{os.getuid()}"
    plant(predictable, source, 0o777)
    assert kernels.load_kernel(source)() == "genuine"
    used = kernels.kernel_folder()
    assert os.path.dirname(used) == str(tmp_path / "tmp") and used != str(predictable)
    assert_private(used)
    assert kernels.kernel_folder() == used  # one folder for the whole process


def assert_private(folder) -> None:
    found = os.lstat(folder)
    assert stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid()
    assert found.st_mode & 0o077 == 0, oct(found.st_mode)


def test_a_planted_bytecode_cache_is_not_run_in_place_of_the_checked_source(home):
    # Python's file loader runs __pycache__'s bytecode when its recorded source size and
    # time match the file: checking the source's hash would not be enough.
    import importlib._bootstrap_external as external
    import importlib.util

    source = genuine_source()
    folder = home / ".cache" / "sexpgpu" / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    path = planted_path(folder, source)
    path.write_text(source)
    tampered = "def kernel():\n    return 'tampered'\n"
    tampered += "#" * (len(source) - len(tampered) - 1) + "\n"
    found = os.stat(path)
    bytecode = external._code_to_timestamp_pyc(compile(tampered, str(path), "exec"), found.st_mtime, found.st_size)
    cached = importlib.util.cache_from_source(str(path))
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    with open(cached, "wb") as handle:
        handle.write(bytecode)
    assert kernels.load_kernel(source)() == "genuine"
