"""A run directory belongs to one run: a fresh run refuses another run's files before writing
anything, a lock keeps a second process out, every destination is tried before the first step,
the metrics log never ends in a torn line, and a run's name cannot leave runs/."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sexpgpu.cli.main import main
from sexpgpu.run.rundir import safe_component, still_named

from test_cli import EXAMPLES, ROOT, sexpgpu
from test_resume import start


def tiny(tmp_path: Path, steps: int = 3, every: int = 3, name: str = "tiny-adam", seed: int = 20261129,
         to: str | None = None) -> Path:
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    text = text.replace(":steps 200", f":steps {steps}").replace(":every 50", f":every {every}")
    target = f' :to "{to}"' if to else ""
    text = text.replace(":checkpoint 100", f":checkpoint (every {every}{target})")
    text = text.replace("(defrun tiny-adam", f"(defrun {name}").replace(":seed 20261129", f":seed {seed}")
    path = tmp_path / f"{abs(hash((steps, every, name, seed, to)))}.sexp"
    path.write_text(text)
    return path


def run(capsys, *args) -> tuple[int, str]:
    status = main(["run", *map(str, args), "--device", "cpu"])
    return status, capsys.readouterr().err


def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_fresh_run_refuses_another_runs_directory_before_writing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(capsys, tiny(tmp_path), "--run-dir", run_dir)[0] == 0
    (run_dir / "run.lock").unlink()  # as a run of an earlier version left it: the refusal must not add one
    before = snapshot(run_dir)
    status, err = run(capsys, tiny(tmp_path, seed=7), "--run-dir", run_dir)
    assert status == 2
    assert "E-RUN-001" in err and "experiment.json, metrics.jsonl, report.txt, step-3" in err
    assert "--resume latest" in err and "another --run-dir" in err
    assert snapshot(run_dir) == before


def test_a_fresh_run_refuses_a_checkpoint_directory_with_another_runs_checkpoints(tmp_path, capsys):
    shared = tmp_path / "checkpoints"
    assert run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "a", "--checkpoint-to", shared)[0] == 0
    before = snapshot(shared)
    status, err = run(capsys, tiny(tmp_path, seed=7), "--run-dir", tmp_path / "b", "--checkpoint-to", shared)
    assert status == 2 and "E-RUN-001" in err and "step-3" in err
    assert snapshot(shared) == before
    assert not (tmp_path / "b" / "metrics.jsonl").exists()


def test_a_second_process_is_kept_out_while_a_run_holds_its_directory(tmp_path):
    run_dir, file = tmp_path / "run", tiny(tmp_path, steps=10_000, every=1)
    log = open(tmp_path / "first.err", "w")  # 10,000 steps of progress lines: a pipe would fill and stop it
    first = start(["run", str(file), "--device", "cpu", "--run-dir", str(run_dir)],
                  env={"SEXPGPU_TEST_CHECKPOINT_SLEEP": "0.02"}, log=log)
    try:
        # the first run holds the lock once it logs a step; a loaded CI machine may take minutes to get there
        deadline = time.monotonic() + 600
        while not (run_dir / "metrics.jsonl").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (run_dir / "metrics.jsonl").exists() and first.poll() is None, "the first run never got going"
        for extra in ([], ["--resume", "latest"]):
            second = sexpgpu("run", str(file), "--device", "cpu", "--run-dir", str(run_dir), *extra)
            assert second.returncode == 2, second.stderr
            assert "E-RUN-002" in second.stderr and f"pid {first.pid} on host" in second.stderr
        assert first.poll() is None, "the first run ended before the second was refused"
    finally:
        first.send_signal(signal.SIGINT)
        status = first.wait(timeout=300)
        log.close()
        assert status == 130, (tmp_path / "first.err").read_text()[-2000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [record["step"] for record in records if "digest" in record]
    assert steps == list(range(1, len(steps) + 1)) and steps


def test_a_run_directory_through_a_file_is_a_coded_error(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("notes\n")
    status, err = run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "notes.txt" / "run")
    assert status == 2 and "E-RUN-003" in err and "Not a directory" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_run_directory_is_a_coded_error(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        status, err = run(capsys, tiny(tmp_path), "--run-dir", locked)
    finally:
        locked.chmod(0o755)
    assert status == 2 and "E-RUN-003" in err and "Permission denied" in err


def test_a_bad_checkpoint_destination_stops_the_run_before_its_first_step(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("notes\n")
    status, err = run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "run",
                      "--checkpoint-to", tmp_path / "notes.txt" / "ckpt")
    assert status == 2 and "E-DISK-002" in err and "notes.txt" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    status, err = run(capsys, tiny(tmp_path, to=str(tmp_path / "notes.txt" / "to")), "--run-dir", tmp_path / "run2")
    assert status == 2 and "E-DISK-002" in err
    assert not (tmp_path / "run2" / "metrics.jsonl").exists()


def test_s3_destinations_are_tried_before_the_first_step(tmp_path, capsys, s3):
    missing = run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "a", "--checkpoint-to", "s3://no-such-bucket-x/run")
    assert missing[0] == 2 and "E-S3-003" in missing[1]
    assert not (tmp_path / "a" / "metrics.jsonl").exists()
    good = run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "b", "--checkpoint-to", s3.uri("run"))
    assert good[0] == 0, good[1]
    assert sorted(key.rsplit("/", 2)[-2] for key in s3.keys("run/") if key.endswith("COMMITTED")) == ["step-3"]
    assert not [key for key in s3.keys() if "write-check" in key]
    again = run(capsys, tiny(tmp_path, seed=7), "--run-dir", tmp_path / "c", "--checkpoint-to", s3.uri("run"))
    assert again[0] == 2 and "E-RUN-001" in again[1] and "[3]" in again[1]
    assert not (tmp_path / "c" / "metrics.jsonl").exists()


FULL_DISK = """
import resource, signal, sys
from sexpgpu.errors import SexpgpuError
from sexpgpu.run.metrics import MetricsLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # past the limit, write() fails with EFBIG instead
log = MetricsLog(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
try:
    for step in range(1, 1000):
        log.write({"step": step, "loss": 1.0 / step, "note": "x" * 37})
except SexpgpuError as error:
    print(error.code)
"""


def test_a_full_disk_never_leaves_a_torn_metrics_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    child = subprocess.run([sys.executable, "-c", FULL_DISK, str(path)], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert child.stdout.strip() == "E-DISK-001", child.stderr
    text = path.read_text()
    assert 900 < len(text) <= 1000 and text.endswith("\n")
    steps = [json.loads(line)["step"] for line in text.splitlines()]
    assert steps == list(range(1, len(steps) + 1))


@pytest.mark.parametrize("torn", ['{"step": 4, "lo', '{"step": 4, "loss": 1.0}'])
def test_a_resume_drops_a_torn_last_line_and_says_so(tmp_path, capsys, torn):
    file = tiny(tmp_path, steps=6, every=3)
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert run(capsys, file, "--run-dir", reference)[0] == 0
    assert run(capsys, file, "--run-dir", resumed)[0] == 0
    lines = (resumed / "metrics.jsonl").read_text().splitlines(keepends=True)
    through_step_3 = [line for line in lines if json.loads(line)["step"] <= 3]
    (resumed / "metrics.jsonl").write_text("".join(through_step_3) + torn)
    status, err = run(capsys, file, "--run-dir", resumed, "--resume", resumed / "step-3")
    assert status == 0, err
    assert "its last line was torn" in err and f"({len(torn)} bytes" in err
    assert (resumed / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("name", ["../escape", "{tmp}/outside"])
def test_a_run_name_cannot_leave_the_runs_folder(tmp_path, capsys, monkeypatch, name):
    name = name.format(tmp=tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    file = tiny(tmp_path, name=name)
    monkeypatch.chdir(work)
    assert run(capsys, file)[0] == 0
    assert [p.name for p in work.iterdir()] == ["runs"]
    [run_dir] = (work / "runs").iterdir()
    assert (run_dir / "metrics.jsonl").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".sexp") == ["work"]


def test_a_safe_component_is_one_plain_name():
    assert safe_component("../x") == "_._x"
    assert safe_component("/etc/passwd") == "_etc_passwd"
    assert safe_component("tiny-adam") == "tiny-adam"
    assert safe_component("..") == "_."


def stacked_choices(tmp_path: Path, capsys) -> Path:
    """A choices record the CPU interpreter cannot take (a stacking of 2): E-CHOICE-001 at setup."""
    assert run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "theirs")[0] == 0
    experiment = json.loads((tmp_path / "theirs" / "experiment.json").read_text())
    experiment["choices"]["stacking"] = 2
    (tmp_path / "stacked.json").write_text(json.dumps(experiment))
    return tmp_path / "stacked.json"


REFUSALS = {  # flags that refuse a run before its first step, and the code they refuse it with
    "nothing to resume": (lambda tmp_path, capsys: ["--resume", "latest"], "E-CKPT-003"),
    "choices it cannot take": (lambda tmp_path, capsys: ["--choices", stacked_choices(tmp_path, capsys)],
                               "E-CHOICE-001"),
    "checkpoints through a file": (lambda tmp_path, capsys: ["--checkpoint-to", tmp_path / "notes.txt" / "ckpt"],
                                   "E-DISK-002"),
    "a separate checkpoint directory": (lambda tmp_path, capsys: ["--checkpoint-to", tmp_path / "new" / "ckpt",
                                                                  "--resume", "latest"], "E-CKPT-003"),
}


@pytest.mark.parametrize("refusal", REFUSALS.values(), ids=REFUSALS)
def test_a_run_refused_before_its_first_step_leaves_no_directory_it_made(tmp_path, capsys, refusal):
    flags, code = refusal
    (tmp_path / "notes.txt").write_text("notes\n")
    extra = flags(tmp_path, capsys)
    status, err = run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "new" / "run", *extra)
    assert status == 2 and code in err
    assert not (tmp_path / "new").exists()  # the run directory, its parent and any checkpoint directory made


def test_a_run_refused_before_its_first_step_leaves_no_default_run_directory(tmp_path, capsys, monkeypatch):
    file = tiny(tmp_path)
    monkeypatch.chdir(tmp_path)
    status, err = run(capsys, file, "--resume", "latest")
    assert status == 2 and "E-CKPT-003" in err
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs" / "older").mkdir(parents=True)
    assert run(capsys, file, "--resume", "latest")[0] == 2
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["older"]


def test_a_refused_run_leaves_an_s3_run_no_directory(tmp_path, capsys, s3):
    status, err = run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "run", "--checkpoint-to", "s3://no-such-bucket-x/r")
    assert status == 2 and "E-S3-003" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("refusal", REFUSALS.values(), ids=REFUSALS)
def test_a_refused_run_leaves_a_directory_that_was_there_as_it_was(tmp_path, capsys, refusal):
    flags, code = refusal
    (tmp_path / "notes.txt").write_text("notes\n")
    extra = flags(tmp_path, capsys)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "plan.txt").write_text("a plan\n")
    status, err = run(capsys, tiny(tmp_path), "--run-dir", tmp_path / "mine", *extra)
    assert status == 2 and code in err
    assert snapshot(tmp_path / "mine") == {"plan.txt": b"a plan\n"}  # no run.lock either


def test_a_refused_resume_leaves_the_run_directory_as_it_was(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(capsys, tiny(tmp_path), "--run-dir", run_dir)[0] == 0
    before = snapshot(run_dir)
    status, err = run(capsys, tiny(tmp_path, seed=7), "--run-dir", run_dir, "--resume", "latest")
    assert status == 2 and "E-CKPT-002" in err
    after = snapshot(run_dir)
    # the refused run held the lock and wrote its pid and start there, whose second may be the next
    assert json.loads(after.pop("run.lock"))["pid"] == json.loads(before.pop("run.lock"))["pid"]
    assert after == before


def test_a_lock_is_held_only_on_the_file_that_still_bears_its_name(tmp_path):
    path = tmp_path / "run.lock"
    path.write_text("")
    early = os.open(path, os.O_RDWR)  # opened just before a refused run deleted the file it made
    try:
        assert still_named(early, str(path))
        path.unlink()
        assert not still_named(early, str(path))
        path.write_text("")  # the next run's
        assert not still_named(early, str(path))
    finally:
        os.close(early)
