"""A run whose memory plan cannot fit this machine stops before its first step (E-MEM-002),
naming its largest tensors and what shrinks them; an allocation that fails during a run
stops it with E-MEM-003. No test here allocates more than a few hundred MB: the runs that
would are stopped by the check, or by an address-space limit (RLIMIT_AS) of their own
process, which fails a real allocation."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from sexpgpu.cli.main import main
from sexpgpu.errors import SexpgpuError
from sexpgpu.lang.forms import load_experiment
from sexpgpu.plan.fit import HOST_SHARE, Room, check_fits, host_room
from sexpgpu.run.setup import build_run

ROOT = Path(__file__).resolve().parents[2]
SPIRALS = ROOT / "examples" / "data" / "spirals.npz"
GIB = 2**30
ADDRESS_SPACE = GIB  # each subprocess's limit: a run that allocated past it fails, it is never killed


def tiny_adam(tmp_path: Path, batch: int) -> Path:
    text = (ROOT / "examples" / "tiny-adam.sexp").read_text().replace('"data/spirals.npz"', f'"{SPIRALS}"')
    path = tmp_path / "tiny.sexp"
    text = text.replace(":shuffle true", ":shuffle false").replace(":batch 64", f":batch {batch}")
    path.write_text(text.replace(":steps 200", ":steps 2"))
    return path


WIDE = """
(defgraph wide (x) :hidden 1073741824
  (linear (relu (linear x :out hidden :as fc1)) :out 3 :as head))
(defrun wide
  :seed 1
  :data (records "{data}")
  :model (wide x)
  :loss (cross-entropy y)
  :optimizer (sgd :lr 0.01)
  :batch 4
  :steps 2)
"""


def limited_run(*args, env: dict) -> subprocess.CompletedProcess:
    """`sexpgpu ARGS` in a process whose address space is limited to ADDRESS_SPACE."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    environment = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env)
    environment.pop("SEXPGPU_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], cwd=ROOT, env=environment, preexec_fn=limit,
                          capture_output=True, text=True, timeout=120)


def test_a_batch_no_machine_holds_stops_the_run_before_anything_large_is_allocated(tmp_path):
    run_dir = tmp_path / "run"
    result = limited_run("run", str(tiny_adam(tmp_path, 2147483647)), "--device", "cpu", "--run-dir", str(run_dir),
                         env={"SEXPGPU_HOST_MEMORY": str(16 * GIB)})
    assert result.returncode == 2, result.stderr
    assert "error E-MEM-002" in result.stderr and "Traceback" not in result.stderr
    message = result.stderr
    assert "memory plan needs 2,608." in message and "16.0 GiB" in message
    assert "matmul in fc1" in message and "tiny.sexp:6:17" in message and "f32[2147483647 64]" in message
    assert ":batch" in message and "more :microbatches" in message
    assert not run_dir.exists()  # stopped before the run directory was claimed


def test_a_parameter_too_large_names_the_parameter_as_what_to_shrink(tmp_path, monkeypatch):
    monkeypatch.setenv("SEXPGPU_HOST_MEMORY", str(16 * GIB))
    path = tmp_path / "wide.sexp"
    path.write_text(WIDE.format(data=SPIRALS))
    with pytest.raises(SexpgpuError) as raised:  # before, it returned, and the run drew 24 GiB of parameters
        build_run(load_experiment(path), "cpu")
    error = raised.value
    assert error.code == "E-MEM-002"
    # the update's flat vectors of every parameter are the largest; the largest parameter is named
    assert "memory plan needs 120.0 GiB" in error.message and "(f32[6442450947], 24.0 GiB)" in error.message
    assert f"They scale with the parameters' sizes (the largest: head/w (f32[3 1073741824], declared at {path}:3:3))" \
        in error.message
    assert ":batch" not in error.hint and "parameter" in error.hint


def test_check_warns_that_the_plan_exceeds_this_machine_and_succeeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEXPGPU_HOST_MEMORY", str(16 * GIB))
    assert main(["check", str(tiny_adam(tmp_path, 2147483647)), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "memory plan" in out and "choices" in out
    warning = [line for line in err.splitlines() if "E-MEM-002" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: ") and "`sexpgpu run` here stops with E-MEM-002 before its first step" in warning[0]


def test_a_run_that_fits_is_not_warned_about(tmp_path, capsys):
    assert main(["check", str(tiny_adam(tmp_path, 64)), "--device", "cpu"]) == 0
    assert "E-MEM" not in capsys.readouterr().err


def test_a_plan_may_take_the_share_of_the_room_and_no_more():
    room = Room(10 * GIB, "test room")
    check_fits(int(HOST_SHARE * 10 * GIB) - 1, room, largest=(), share=HOST_SHARE)
    with pytest.raises(SexpgpuError) as raised:
        check_fits(int(HOST_SHARE * 10 * GIB) + 1, room, largest=(), share=HOST_SHARE)
    assert raised.value.code == "E-MEM-002" and "test room" in raised.value.message


def test_the_host_room_is_the_least_of_meminfo_the_cgroup_limit_and_the_address_space(tmp_path):
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (cgroup / "memory").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       32000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    (proc / "self" / "status").write_text("Name:\tpython\nVmSize:\t  100000 kB\n")
    assert host_room(proc=proc, cgroup=cgroup, address_limit=None).bytes == 20000000 * 1024
    (cgroup / "memory" / "memory.limit_in_bytes").write_text(f"{8 * GIB}\n")
    (cgroup / "memory" / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    room = host_room(proc=proc, cgroup=cgroup, address_limit=None)
    assert room.bytes == 7 * GIB and "cgroup" in room.where
    room = host_room(proc=proc, cgroup=cgroup, address_limit=2 * GIB)
    assert room.bytes == 2 * GIB - 100000 * 1024 and "ulimit -v" in room.where
    (cgroup / "memory.max").write_text("max\n")  # cgroup v2 without a limit: v1's files are not read
    (cgroup / "memory.current").write_text("5\n")
    assert host_room(proc=proc, cgroup=cgroup, address_limit=None).bytes == 20000000 * 1024
    room = host_room(3 * GIB, proc=proc, cgroup=cgroup, address_limit=None)
    assert room.bytes == 3 * GIB and "SEXPGPU_HOST_MEMORY" in room.where


def test_this_machine_reports_some_room():
    assert host_room().bytes > 0


def test_an_allocation_that_fails_during_a_step_is_E_MEM_003_and_keeps_the_run_consistent(tmp_path):
    """The check is told the machine has a TiB; the process's address space says otherwise,
    so the first large array of step 1 (fc1's 2 GiB product) fails to allocate."""
    run_dir = tmp_path / "run"
    result = limited_run("run", str(tiny_adam(tmp_path, 2**23)), "--device", "cpu", "--run-dir", str(run_dir),
                         env={"SEXPGPU_HOST_MEMORY": str(1024 * GIB)})
    assert result.returncode == 2, result.stderr
    assert "error E-MEM-003" in result.stderr and "Traceback" not in result.stderr
    assert "at step 1" in result.stderr and ":batch" in result.stderr
    assert (run_dir / "metrics.jsonl").read_text() == ""


def test_evaluate_checks_only_its_passes_against_this_machine(tmp_path, monkeypatch, capsys):
    """tiny-adam's training needs about 180 kB at its fullest, its pass about 70 kB."""
    path = tiny_adam(tmp_path, 64)
    assert main(["run", str(path), "--device", "cpu", "--run-dir", str(tmp_path / "run")]) == 0
    monkeypatch.setenv("SEXPGPU_HOST_MEMORY", "120000")
    assert main(["run", str(path), "--device", "cpu", "--run-dir", str(tmp_path / "again")]) == 2
    assert "error E-MEM-002" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "run" / "step-2"), "--device", "cpu"]) == 0
    monkeypatch.setenv("SEXPGPU_HOST_MEMORY", "60000")
    assert main(["evaluate", str(tmp_path / "run" / "step-2"), "--device", "cpu"]) == 2
    assert "error E-MEM-002" in capsys.readouterr().err


def test_every_memory_and_number_code_is_documented_raised_and_tested():
    code = re.compile(r"E-(?:MEM|NUM)-\d{3}")
    documented = set(code.findall((ROOT / "docs" / "errors.md").read_text()))
    raised = {found for path in (ROOT / "src" / "sexpgpu").rglob("*.py") for found in code.findall(path.read_text())}
    tests = "".join(path.read_text() for path in (ROOT / "tests").rglob("test_*.py"))
    assert documented == raised == {"E-MEM-001", "E-MEM-002", "E-MEM-003", "E-NUM-001"}
    for found in documented:
        assert f"error {found}" in tests or f'"{found}"' in tests, found


@pytest.mark.gpu
def test_on_a_gpu_a_batch_it_cannot_hold_is_refused_against_its_free_memory(tmp_path, capsys):
    assert main(["run", str(tiny_adam(tmp_path, 2147483647)), "--device", "cuda", "--run-dir",
                 str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error E-MEM-002: the run's memory plan needs") and "the GPU memory free now" in error
    assert "They scale with :batch (2147483647)" in error
