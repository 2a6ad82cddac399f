"""sexpgpu/files.py: a file is the old one or the new one whatever happens, on the disk as in
memory (fsynced, with its folder), and one flock serves every lock."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sexpgpu import files

SOURCE = str(Path(__file__).resolve().parents[2] / "src")
# a file written, renamed or locked by hand
BY_HAND = re.compile(r"open\([^)]*[\"'](?:w|wb|a|ab|x)[\"']|os\.replace|os\.rename|fcntl|mkstemp")
# the writers that are not a whole file's: a checkpoint's directory, written file by file
# (each fsynced) and renamed whole, and the run directory's write check (a file made and deleted)
WRITTEN_OTHERWISE = {"store/local_store.py": 3, "run/rundir.py": 1}
# a child that writes "new" over "old" and is killed at `point`, the moment a crash could come
CRASHING = """
import os, signal, sys
from sexpgpu import files
path, point = sys.argv[1], sys.argv[2]
files.write_atomically(path, "old")
crash = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
if point == "before the rename":
    os.replace = crash
else:
    files.fsync_directory = crash
files.write_atomically(path, "new")
"""


@pytest.mark.parametrize("point, left", [("before the rename", "old"), ("after the rename", "new")])
def test_a_crash_leaves_the_old_file_or_the_new_one_never_a_part(tmp_path, point, left):
    path = tmp_path / "record.json"
    child = subprocess.run([sys.executable, "-c", CRASHING, str(path), point], env={**os.environ, "PYTHONPATH": SOURCE})
    assert child.returncode == -signal.SIGKILL
    assert path.read_text() == left


def test_the_file_and_its_folder_are_fsynced(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.fstat(fd).st_mode) or fsync(fd))
    files.write_atomically(str(tmp_path / "a" / "b.txt"), b"bytes")
    assert (tmp_path / "a" / "b.txt").read_bytes() == b"bytes"
    assert [stat.S_ISREG(mode) for mode in synced] == [True, False]  # the file, then its folder


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    files.write_atomically(str(path), "old")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        files.write_atomically(str(path), "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["record.json"]


def test_the_file_takes_the_mode_open_gives(tmp_path):
    files.write_atomically(str(tmp_path / "f"), "x")
    with open(tmp_path / "g", "w") as handle:
        handle.write("x")
    assert os.stat(tmp_path / "f").st_mode == os.stat(tmp_path / "g").st_mode


def test_one_lock_excludes_another_and_shared_ones_do_not(tmp_path):
    path = str(tmp_path / "run.lock")
    with files.locked(path):
        other = os.open(path, os.O_RDWR)
        try:
            assert not files.lock(other, wait=False) and not files.lock(other, shared=True, wait=False)
        finally:
            os.close(other)
    first, second = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        assert files.lock(first, shared=True, wait=False) and files.lock(second, shared=True, wait=False)
    finally:
        os.close(first)
        os.close(second)


def test_every_writer_of_a_whole_file_and_every_lock_go_through_files_py():
    package = Path(SOURCE) / "sexpgpu"
    found = {str(path.relative_to(package)): len(BY_HAND.findall(path.read_text()))
             for path in package.rglob("*.py") if path.name != "files.py" and path.parts[-2] != "exact"}
    assert {path: count for path, count in found.items() if count} == WRITTEN_OTHERWISE
