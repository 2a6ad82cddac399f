"""Checkpoints on a local disk: layout, digests, atomicity, retention and every error."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import time

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch

import checkpoint_child
from store_samples import BF16, sample_record, sample_tensors, same_tensors
from sexpgpu.errors import SexpgpuError
from sexpgpu.store import local_store
from sexpgpu.store import list_checkpoints, read_checkpoint, resolve_checkpoint, verify_checkpoint, write_checkpoint


def write(root, step, big_bytes=0, **kwargs):
    return write_checkpoint(str(root), step, sample_tensors(step, big_bytes), sample_record(step), bf16=BF16, **kwargs)


def snapshot(root) -> dict[str, bytes]:
    """Every file under root and its bytes, to show that nothing was changed."""
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            files[os.path.relpath(path, root)] = open(path, "rb").read()
    return files


def test_a_checkpoint_round_trips_every_bit_and_records_its_digests(tmp_path):
    path = write(tmp_path, 3)
    assert path == str(tmp_path / "step-3")
    assert sorted(os.listdir(path)) == ["COMMITTED", "experiment.json", "model.safetensors", "optimizer.safetensors"]
    checkpoint = read_checkpoint(path)
    assert checkpoint.step == 3 and checkpoint.path == path
    assert same_tensors(checkpoint.tensors, sample_tensors(3))
    assert checkpoint.stored_dtypes["param/head/w"] == "BF16" and checkpoint.stored_dtypes["param/encoder/w"] == "F32"
    record = json.loads((tmp_path / "step-3" / "experiment.json").read_text())
    assert {k: record[k] for k in sample_record(3)} == sample_record(3)
    assert record["step"] == 3 and record["format"] == "sexpgpu-checkpoint/1"
    for name in ("model.safetensors", "optimizer.safetensors"):
        data = (tmp_path / "step-3" / name).read_bytes()
        assert record["tensors"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    marker = json.loads((tmp_path / "step-3" / "COMMITTED").read_text())
    assert marker["experiment.json"]["sha256"] == hashlib.sha256((tmp_path / "step-3" / "experiment.json").read_bytes()).hexdigest()


def test_the_safetensors_library_reads_the_tensor_files(tmp_path):
    path = write(tmp_path, 1)
    expected = sample_tensors(1)
    model = safetensors.torch.load_file(os.path.join(path, "model.safetensors"))
    assert sorted(model) == ["encoder/b", "encoder/w", "head/w"]
    assert np.array_equal(model["encoder/w"].numpy(), expected["param/encoder/w"])
    assert np.array_equal(model["head/w"].float().numpy(), expected["param/head/w"])
    optimizer = safetensors.numpy.load_file(os.path.join(path, "optimizer.safetensors"))
    assert np.array_equal(optimizer["state/count"], expected["state/count"]) and optimizer["state/count"].shape == ()
    assert np.array_equal(optimizer["flags/seen"], expected["flags/seen"])


def test_latest_is_the_newest_committed_step_and_ignores_unfinished_ones(tmp_path):
    for step in (2, 10, 4):
        write(tmp_path, step)
    torn = tmp_path / "step-20"  # a copy interrupted before its marker
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"\0" * 16)
    (tmp_path / ".step-30.partial-abc").mkdir()
    assert resolve_checkpoint("latest", str(tmp_path)) == str(tmp_path / "step-10")
    assert list_checkpoints(str(tmp_path)) == [(s, str(tmp_path / f"step-{s}")) for s in (2, 4, 10)]
    assert resolve_checkpoint(str(tmp_path / "step-4"), "/elsewhere") == str(tmp_path / "step-4")
    assert resolve_checkpoint("step-2", str(tmp_path)) == str(tmp_path / "step-2")


def test_a_missing_step_names_the_steps_that_exist(tmp_path):
    write(tmp_path, 5)
    (tmp_path / "step-20").mkdir()
    for spec in (str(tmp_path / "step-7"), str(tmp_path / "step-20")):
        with pytest.raises(SexpgpuError) as caught:
            resolve_checkpoint(spec, str(tmp_path))
        assert caught.value.code == "E-CKPT-003" and "[5]" in caught.value.message
    with pytest.raises(SexpgpuError, match="name a step") as caught:
        resolve_checkpoint(str(tmp_path), str(tmp_path))
    assert caught.value.code == "E-CKPT-003"
    with pytest.raises(SexpgpuError) as caught:
        read_checkpoint(str(tmp_path / "step-7"))
    assert caught.value.code == "E-CKPT-003"


def test_latest_with_no_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    (tmp_path / ".step-1.partial-x").mkdir()
    with pytest.raises(SexpgpuError) as caught:
        resolve_checkpoint("latest", str(tmp_path))
    assert caught.value.code == "E-CKPT-003"
    with pytest.raises(SexpgpuError):
        resolve_checkpoint("latest", str(tmp_path / "no-such-run"))


def corrupt_truncate(path):
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:-3])


def corrupt_flip_a_tensor_bit(path):
    data = bytearray((path / "optimizer.safetensors").read_bytes())
    data[-5] ^= 0x01
    (path / "optimizer.safetensors").write_bytes(bytes(data))


def corrupt_experiment(path):
    text = (path / "experiment.json").read_text().replace('"selection": "tiny"', '"selection": "tinz"')
    (path / "experiment.json").write_text(text)


def corrupt_remove_a_file(path):
    (path / "optimizer.safetensors").unlink()


def corrupt_marker(path):
    (path / "COMMITTED").write_text("not json")


DAMAGES = [corrupt_truncate, corrupt_flip_a_tensor_bit, corrupt_experiment, corrupt_remove_a_file, corrupt_marker]


@pytest.mark.parametrize("damage", DAMAGES)
def test_damage_is_found_by_the_digests_and_nothing_is_changed(tmp_path, damage):
    path = write(tmp_path, 1)
    damage(tmp_path / "step-1")
    before = snapshot(tmp_path)
    with pytest.raises(SexpgpuError) as caught:
        read_checkpoint(path)
    assert caught.value.code == "E-CKPT-001", caught.value.render()
    assert snapshot(tmp_path) == before


def test_keep_deletes_older_checkpoints_only_after_the_new_one_is_committed(tmp_path):
    for step in range(1, 6):
        write(tmp_path, step, keep=2)
        assert [s for s, _ in list_checkpoints(str(tmp_path))] == list(range(max(1, step - 1), step + 1))
    assert sorted(os.listdir(tmp_path)) == ["step-4", "step-5"]


def test_keep_never_deletes_a_later_step(tmp_path):
    for step in (1, 2, 10):
        write(tmp_path, step)
    write(tmp_path, 3, keep=1)
    assert [s for s, _ in list_checkpoints(str(tmp_path))] == [3, 10]


def test_a_different_checkpoint_at_the_same_step_is_never_overwritten(tmp_path):
    path = write(tmp_path, 4)
    before = snapshot(tmp_path)
    assert write(tmp_path, 4) == path  # the same bytes again: kept as it is
    assert snapshot(tmp_path) == before
    other = sample_tensors(4)
    other["param/encoder/b"] = other["param/encoder/b"] + 1
    with pytest.raises(SexpgpuError) as caught:
        write_checkpoint(str(tmp_path), 4, other, sample_record(4), bf16=BF16)
    assert caught.value.code == "E-CKPT-004"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_at_the_step_is_replaced_and_said_so(tmp_path, damage):
    path = write(tmp_path, 4)
    damage(tmp_path / "step-4")
    notes = []
    assert write(tmp_path, 4, note=notes.append) == path
    assert verify_checkpoint(path).step == 4
    assert same_tensors(read_checkpoint(path).tensors, sample_tensors(4))
    assert sorted(os.listdir(tmp_path)) == ["step-4"]  # the damaged one set aside, then deleted
    (line,) = notes
    assert path in line and "damaged" in line and "replaced" in line


def test_a_damaged_checkpoint_with_other_tensors_is_replaced_too(tmp_path):
    other = sample_tensors(4)
    other["param/encoder/b"] = other["param/encoder/b"] + 1
    path = write_checkpoint(str(tmp_path), 4, other, sample_record(4), bf16=BF16)
    corrupt_truncate(tmp_path / "step-4")
    assert write(tmp_path, 4) == path
    assert same_tensors(read_checkpoint(path).tensors, sample_tensors(4))


def test_a_writer_commits_over_a_committed_checkpoint_only_when_told_to_replace_it(tmp_path):
    write(tmp_path, 1)
    before = snapshot(tmp_path)
    writer = local_store.Writer(str(tmp_path), 1)
    with pytest.raises(SexpgpuError) as caught:
        writer.commit(b"{}")
    assert caught.value.code == "E-CKPT-004"
    writer.abort()
    assert snapshot(tmp_path) == before
    local_store.Writer(str(tmp_path), 1, replacing=True).commit(b"{}")
    assert sorted(os.listdir(tmp_path)) == ["step-1"] and os.listdir(tmp_path / "step-1") == ["COMMITTED"]


@pytest.mark.parametrize("point", ["file:model.safetensors", "commit"])
def test_a_crash_while_replacing_a_damaged_checkpoint_leaves_it_as_it_was(tmp_path, point):
    write(tmp_path, 1)
    path = write(tmp_path, 2)
    corrupt_truncate(tmp_path / "step-2")
    damaged = snapshot(tmp_path / "step-2")
    killed = checkpoint_child.run(tmp_path, 2, 2, env={"SEXPGPU_TEST_CHECKPOINT_KILL_AT": point})
    assert killed.returncode == -signal.SIGKILL
    assert snapshot(tmp_path / "step-2") == damaged  # never half replaced
    assert write(tmp_path, 2) == path
    assert same_tensors(read_checkpoint(path).tensors, sample_tensors(2))
    assert sorted(os.listdir(tmp_path)) == ["step-1", "step-2"]


def test_a_full_disk_is_E_DISK_001_and_leaves_what_exists_alone(tmp_path):
    write(tmp_path, 1)
    before = snapshot(tmp_path)
    result = checkpoint_child.run(tmp_path, 2, 2, big_bytes=4 << 20, file_limit=1 << 20)
    assert result.returncode == 2, result.stderr
    assert "E-DISK-001" in result.stderr and "Traceback" not in result.stderr
    assert snapshot(tmp_path) == before  # no step-2, no partial directory, step-1 untouched
    assert resolve_checkpoint("latest", str(tmp_path)) == str(tmp_path / "step-1")


def test_an_unwritable_place_is_E_DISK_002(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(SexpgpuError) as caught:
        write(tmp_path / "a-file" / "run", 1)
    assert caught.value.code == "E-DISK-002"
    assert (tmp_path / "a-file").read_text() == "x"


KILL_POINTS = ["start", "mid:model.safetensors", "file:model.safetensors", "mid:optimizer.safetensors",
               "file:optimizer.safetensors", "file:experiment.json", "commit"]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_while_writing_never_leaves_a_checkpoint_that_latest_takes(tmp_path, point):
    write(tmp_path, 1)
    killed = checkpoint_child.run(tmp_path, 2, 2, big_bytes=1 << 20, env={"SEXPGPU_TEST_CHECKPOINT_KILL_AT": point})
    assert killed.returncode == -signal.SIGKILL
    assert resolve_checkpoint("latest", str(tmp_path)) == str(tmp_path / "step-1")
    assert same_tensors(read_checkpoint(str(tmp_path / "step-1")).tensors, sample_tensors(1))
    assert not (tmp_path / "step-2").exists()
    # The next attempt at the step succeeds, and the crashed writer's leftovers go.
    write(tmp_path, 2, big_bytes=1 << 20)
    assert sorted(os.listdir(tmp_path)) == ["step-1", "step-2"]


def test_a_finished_but_unrenamed_directory_is_not_a_checkpoint_even_when_named(tmp_path):
    killed = checkpoint_child.run(tmp_path, 1, 1, env={"SEXPGPU_TEST_CHECKPOINT_KILL_AT": "commit"})
    assert killed.returncode == -signal.SIGKILL
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".step-1.partial-")]
    assert (partial / "COMMITTED").exists()
    for attempt in (lambda: resolve_checkpoint(str(partial), str(tmp_path)), lambda: read_checkpoint(str(partial))):
        with pytest.raises(SexpgpuError) as caught:
            attempt()
        assert caught.value.code == "E-CKPT-003"


def test_a_checkpoint_copied_under_another_name_still_reads(tmp_path):
    shutil.copytree(write(tmp_path / "run", 2), tmp_path / "best")
    assert resolve_checkpoint(str(tmp_path / "best"), str(tmp_path / "run")) == str(tmp_path / "best")
    assert read_checkpoint(str(tmp_path / "best")).step == 2


def test_sigkill_after_the_commit_keeps_the_new_checkpoint(tmp_path):
    killed = checkpoint_child.run(tmp_path, 1, 1, env={"SEXPGPU_TEST_CHECKPOINT_KILL_AT": "committed"})
    assert killed.returncode == -signal.SIGKILL
    assert same_tensors(read_checkpoint(resolve_checkpoint("latest", str(tmp_path))).tensors, sample_tensors(1))


def test_sigkill_at_random_moments_always_leaves_a_readable_latest(tmp_path):
    chooser = random.Random(5)
    write(tmp_path, 0)
    for attempt in range(3):
        process = checkpoint_child.spawn(tmp_path, 1, 50, big_bytes=1 << 20, keep=2,
                                         env={"SEXPGPU_TEST_CHECKPOINT_SLEEP": "0.01"})
        time.sleep(0.5 + chooser.random())
        process.send_signal(signal.SIGKILL)
        process.communicate()
        latest = resolve_checkpoint("latest", str(tmp_path))
        checkpoint = read_checkpoint(latest)
        assert same_tensors(checkpoint.tensors, sample_tensors(checkpoint.step, 1 << 20 if checkpoint.step else 0))
