"""Resuming: a run killed with SIGKILL at random points, mid-checkpoint included, and resumed
from `latest` each time ends with the same parameters and metrics log, bit for bit, as the
run that was never interrupted. Locally and on a real S3 server."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sexpgpu.cli.main import main
from sexpgpu.store import read_checkpoint

from test_cli import EXAMPLES, ROOT, sexpgpu

STEPS, EVERY = 60, 10


def short_tiny(tmp_path: Path, microbatches: int = 1, to: str | None = None) -> Path:
    """tiny-adam, shortened, with checkpoints every 10 steps keeping the last two."""
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    text = text.replace(":steps 200", f":steps {STEPS} :microbatches {microbatches}")
    target = f' :to "{to}"' if to else ""
    text = text.replace(":checkpoint 100", f":checkpoint (every {EVERY} :keep 2{target})")
    text = text.replace(":every 50", ":every 20")
    path = tmp_path / f"tiny-{microbatches}.sexp"
    path.write_text(text)
    return path


def start(args, env=None, log=None) -> subprocess.Popen:
    """A `sexpgpu` process. A long run should be given `log` (an open file for its stderr): a pipe
    nobody reads fills with its progress lines and stops it in the middle of a write."""
    environment = dict(os.environ, **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "sexpgpu", *args], cwd=ROOT, env=environment,
                            stdout=subprocess.DEVNULL, stderr=log or subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_at_a_terminal)


def _ctrl_c_as_at_a_terminal() -> None:
    """Ctrl-C acts in the child as at a terminal. A test run started as a background job of a
    non-interactive shell (as a CI harness may start it) has SIGINT ignored, every child
    inherits that, and Python then installs no handler: a test that sends it would wait for a
    run that never hears it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_after(process: subprocess.Popen, condition, extra_seconds: float, timeout: float = 300,
               poll: float = 0.05) -> None:
    """SIGKILL `process` `extra_seconds` after `condition()` first holds (or when it ends)."""
    deadline = time.monotonic() + timeout
    while not condition() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(poll)
    time.sleep(extra_seconds)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait()


def steps_logged(run_dir: Path) -> int:
    log = run_dir / "metrics.jsonl"
    return log.read_bytes().count(b'"loss_bits"') if log.exists() else 0  # training records alone


def final_tensors(root: str) -> dict:
    return read_checkpoint(f"{root}/step-{STEPS}").tensors


def committed_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in run_dir.glob("step-*") if (p / "COMMITTED").exists())


def crash_and_resume(file: Path, run_dir: Path, has_checkpoint, crash_points, extra=()) -> None:
    rng = random.Random(20261129)
    base = ["run", str(file), "--device", "cpu", "--run-dir", str(run_dir), *extra]
    # 1. A fresh start, killed at a random step after its first checkpoint: a random step, not a
    # random time, so that however fast the steps go, two checkpoints are left for 2. and 3.
    at = rng.randint(EVERY + 1, STEPS - 2 * EVERY - 5)
    kill_after(start(base), lambda: has_checkpoint() and steps_logged(run_dir) >= at, 0.0, poll=0.002)
    assert max(committed_steps(run_dir), default=0) <= STEPS - 2 * EVERY
    # 2. and 3. Resumes killed in the middle of writing a checkpoint, and just before its commit.
    for point in crash_points:
        process = start(base + ["--resume", "latest"], env={"SEXPGPU_TEST_CHECKPOINT_KILL_AT": point})
        process.wait(timeout=300)
        assert process.returncode == -signal.SIGKILL, process.stderr.read()
    # 4. A resume killed at a random moment.
    kill_after(start(base + ["--resume", "latest"]), lambda: True, rng.uniform(0.5, 2.0))
    # 5. The last resume runs to the end.
    result = sexpgpu(*base, "--resume", "latest")
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout


def test_sigkill_anywhere_then_resume_gives_the_uninterrupted_bits_locally(tmp_path):
    file = short_tiny(tmp_path)
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    assert sexpgpu("run", str(file), "--device", "cpu", "--run-dir", str(reference)).returncode == 0
    crash_and_resume(file, crashed, lambda: bool(committed_steps(crashed)), ("mid:model.safetensors", "commit"))
    assert (crashed / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    ours, theirs = final_tensors(str(crashed)), final_tensors(str(reference))
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[name].view(np.uint8), theirs[name].view(np.uint8)) for name in ours)
    assert committed_steps(crashed)[-2:] == [STEPS - EVERY, STEPS]  # :keep 2


def test_sigkill_anywhere_then_resume_gives_the_uninterrupted_bits_on_s3(tmp_path, s3):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    reference_file = short_tiny(tmp_path / "a", to=s3.uri("ref"))
    crashed_file = short_tiny(tmp_path / "b", to=s3.uri("crash"))
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    result = sexpgpu("run", str(reference_file), "--device", "cpu", "--run-dir", str(reference))
    assert result.returncode == 0, result.stderr
    # Small objects go up in one part: the crash falls between the model's and the optimizer's files.
    crash_and_resume(crashed_file, crashed, lambda: any(key.endswith("COMMITTED") for key in s3.keys("crash/")),
                     ("file:model.safetensors", "commit"))
    assert (crashed / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    ours, theirs = final_tensors(s3.uri("crash")), final_tensors(s3.uri("ref"))
    assert all(np.array_equal(ours[name].view(np.uint8), theirs[name].view(np.uint8)) for name in ours)


def test_resume_refuses_a_changed_microbatch_layout_unless_told(tmp_path):
    run_dir = tmp_path / "run"
    one = short_tiny(tmp_path, microbatches=1)
    assert sexpgpu("run", str(one), "--device", "cpu", "--run-dir", str(run_dir)).returncode == 0
    two = short_tiny(tmp_path, microbatches=2)
    refused = sexpgpu("run", str(two), "--device", "cpu", "--run-dir", str(run_dir), "--resume", f"{run_dir}/step-50")
    assert refused.returncode == 2
    assert "E-RESUME-001" in refused.stderr and "1 microbatches" in refused.stderr and "this run has 2" in refused.stderr
    # Continuing from step 50 into the same directory would overwrite its step 60: refused, kept.
    clash = sexpgpu("run", str(two), "--device", "cpu", "--run-dir", str(run_dir), "--resume", f"{run_dir}/step-50",
                    "--allow-layout-change")
    assert clash.returncode == 2 and "E-CKPT-004" in clash.stderr
    allowed = sexpgpu("run", str(two), "--device", "cpu", "--run-dir", str(tmp_path / "branch"),
                      "--resume", f"{run_dir}/step-50", "--allow-layout-change")
    assert allowed.returncode == 0, allowed.stderr
    assert "bits will differ" in allowed.stdout


def test_resume_from_another_experiment_shows_the_difference(tmp_path):
    run_dir = tmp_path / "run"
    file = short_tiny(tmp_path)
    assert sexpgpu("run", str(file), "--device", "cpu", "--run-dir", str(run_dir)).returncode == 0
    file.write_text(file.read_text().replace(":seed 20261129", ":seed 5"))
    result = sexpgpu("run", str(file), "--device", "cpu", "--run-dir", str(run_dir), "--resume", "latest")
    assert result.returncode == 2
    assert "E-CKPT-002" in result.stderr and "seed" in result.stderr
    assert "Traceback" not in result.stderr


def test_resume_of_a_missing_step_is_an_error_not_a_fresh_start(tmp_path):
    file = short_tiny(tmp_path)
    result = sexpgpu("run", str(file), "--device", "cpu", "--run-dir", str(tmp_path / "empty"), "--resume", "latest")
    assert result.returncode == 2
    assert "E-CKPT-003" in result.stderr
    assert not (tmp_path / "empty" / "metrics.jsonl").exists()


def test_checkpoint_command_shows_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    file = short_tiny(tmp_path)
    assert sexpgpu("run", str(file), "--device", "cpu", "--run-dir", str(run_dir)).returncode == 0
    shown = sexpgpu("checkpoint", str(run_dir / f"step-{STEPS}"))
    assert shown.returncode == 0, shown.stderr
    assert "tiny-adam" in shown.stdout and "param/fc1/w" in shown.stdout
    described = json.loads(sexpgpu("checkpoint", str(run_dir / f"step-{STEPS}"), "--json").stdout)
    assert described["step"] == STEPS


def test_ctrl_c_stops_cleanly_and_says_where(tmp_path):
    file = short_tiny(tmp_path)
    run_dir = tmp_path / "run"
    process = start(["run", str(file), "--device", "cpu", "--run-dir", str(run_dir)])
    deadline = time.monotonic() + 300
    while not committed_steps(run_dir) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip("the run finished before Ctrl-C reached it")
    assert process.returncode == 130
    assert "stopped by Ctrl-C after step" in stderr and "--resume latest" in stderr
    assert "Traceback" not in stderr
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)


def long_tiny(folder: Path, every: int) -> Path:
    """tiny-adam with 8 hidden units and more steps than any test waits for, a checkpoint every `every`."""
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"').replace(":hidden 64", ":hidden 8")
    text = text.replace(":steps 200", ":steps 1000000").replace(":checkpoint 100", f":checkpoint {every}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"long-{every}.sexp"
    path.write_text(text)
    return path


def logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def stopped(process: subprocess.Popen, condition, signum: int, timeout: float = 300) -> str:
    """Send `signum` once `condition()` holds; the process's stderr once it has ended."""
    deadline = time.monotonic() + timeout
    while not condition() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()[1]
    process.send_signal(signum)
    return process.communicate(timeout=120)[1]


def test_ctrl_c_after_a_resume_names_the_checkpoint_it_resumed_from(tmp_path):
    run_dir, checkpoints = tmp_path / "run", tmp_path / "checkpoints"
    where = ["--device", "cpu", "--run-dir", str(run_dir), "--checkpoint-to", str(checkpoints)]
    first = start(["run", str(long_tiny(tmp_path, 2)), *where], env={"SEXPGPU_TEST_CHECKPOINT_KILL_AT": "committed"})
    assert first.wait(timeout=300) == -signal.SIGKILL and committed_steps(checkpoints) == [2]
    # The same run (a checkpoint interval changes no bit), with no checkpoint before it is stopped.
    resumed = start(["run", str(long_tiny(tmp_path, 1000000)), *where, "--resume", "latest"])
    stderr = stopped(resumed, lambda: logged_steps(run_dir) > 3, signal.SIGINT)
    assert resumed.returncode == 130, stderr
    assert "No checkpoint was written" not in stderr and "step 0" not in stderr
    assert f"The last checkpoint is {checkpoints / 'step-2'}" in stderr
    assert f"--checkpoint-to {checkpoints} --resume latest" in stderr


def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path):
    run_dir = tmp_path / "run"
    process = start(["run", str(long_tiny(tmp_path, 2)), "--device", "cpu", "--run-dir", str(run_dir)])
    stderr = stopped(process, lambda: committed_steps(run_dir), signal.SIGTERM)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM after step" in stderr and "--resume latest" in stderr and "Traceback" not in stderr
    assert logged_steps(run_dir) >= 2


def test_a_run_stopped_before_its_first_checkpoint_is_told_a_command_that_works(tmp_path, capsys):
    run_dir, file = tmp_path / "run", long_tiny(tmp_path, 1000000)
    process = start(["run", str(file), "--device", "cpu", "--run-dir", str(run_dir)])
    stderr = stopped(process, lambda: logged_steps(run_dir) > 0, signal.SIGINT)
    assert process.returncode == 130, stderr
    advised = stderr.rsplit("start the run again with: ", 1)[1].strip()
    # Neither continuing nor starting afresh in the same directory can work: it holds no checkpoint.
    for extra, code in ((["--resume", "latest"], "E-CKPT-003"), ([], "E-RUN-001")):
        assert main(["run", str(file), "--device", "cpu", "--run-dir", str(run_dir), *extra]) == 2
        refused = capsys.readouterr().err
        assert code in refused
    # E-RUN-001 says so, and names the same way out as the message at Ctrl-C.
    assert "--resume latest" not in refused and "holds no checkpoint" in refused
    assert f"another --run-dir, such as {run_dir}-2," in refused
    assert advised.startswith("sexpgpu run ") and f"--run-dir {run_dir}-2" in advised
    file.write_text(file.read_text().replace(":steps 1000000", ":steps 3"))  # the advice, not a million steps
    assert main(shlex.split(advised)[1:]) == 0, capsys.readouterr().err
