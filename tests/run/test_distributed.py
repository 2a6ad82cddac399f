"""Runs on several processes (docs/distributed.md), on the CPU with gloo.

One launch goes through torchrun itself: the command docs/distributed.md documents. The other
worlds are forked by run_world (tests/exact) with the environment torchrun gives each process
(distributed_worker.py): a process torchrun starts spends most of its time on two cores
importing torch, and a fork spends none. The fork of a world of 2 nodes of 2 processes at f32
must give the torchrun launch's bits, which ties the two together.

Each world runs once (module fixtures) and is asserted on several times; the runs are the
ladder's tiny-adam (4 microbatches of 16) cut to a few steps."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exact"))
from test_exact_distributed import run_world  # noqa: E402

from distributed_worker import CORRUPTED_AFTER, Launch, run_rank, train_rank  # noqa: E402
from sockets import in_loopback_namespace  # noqa: E402
from sexpgpu.cli.main import main  # noqa: E402
from sexpgpu.errors import SexpgpuError  # noqa: E402
from sexpgpu.distributed.world import BACKENDS, GroupFacts, World, process_device, rounded_with_carry  # noqa: E402
from sexpgpu.store import read_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY_PATH = "src/sexpgpu/ladder/reference/tiny-adam.sexp"  # the reference ladder's tiny-adam, from the root
LADDER_TINY = ROOT / TINY_PATH
DOCS = ROOT / "docs" / "distributed.md"
# the command docs/distributed.md shows, run as it is written (torchrun is torch.distributed.run's script)
DOCUMENTED = "torchrun --standalone --nproc-per-node 2 -m sexpgpu run " + TINY_PATH + " --device cpu --run-dir runs/two"
STEPS, EVERY = 6, 3
BF16_STEPS = 10
# The bf16 envelope (docs/distributed.md): how far a step's loss of 2 nodes sending bf16
# gradients, their rounding carried, may lie from the same nodes' at f32 and from one
# process's, relative to that loss. Measured over these 10 steps: at most 8.1e-6 (step 9).
BF16_ENVELOPE = 1e-4


def tiny(folder: Path, steps: int = STEPS, every: int = EVERY, edits: tuple = ()) -> Path:
    """The ladder's tiny-adam at folder/TINY_PATH, cut to `steps` steps with a
    checkpoint and a pass every `every`, and the (old, new) `edits` made."""
    text = LADDER_TINY.read_text().replace('"data/spirals.npz"', f'"{ROOT}/examples/data/spirals.npz"')
    for old, new in ((":steps 200", f":steps {steps}"), (":checkpoint 100", f":checkpoint {every}"),
                     (":every 50", f":every {every}"), *edits):
        assert old in text, old
        text = text.replace(old, new)
    path = folder / TINY_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def in_process(*argv) -> dict:
    """`sexpgpu ARGV` as one process, here: its status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(arg) for arg in argv])
    return {"status": status, "out": out.getvalue(), "err": err.getvalue()}


def world(out_dir: Path, *argv, **launch) -> list[dict]:
    """`sexpgpu ARGV` on a forked world (Launch's fields in `launch`): each process's status and output."""
    out_dir.mkdir(parents=True)
    spec = Launch(tuple(str(arg) for arg in argv), **launch)
    return run_world(spec.size, out_dir, 240.0, partial(run_rank, spec))


def steps_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def tensor_bits(checkpoint: Path) -> dict:
    return {name: value.tobytes() for name, value in read_checkpoint(str(checkpoint)).tensors.items()}


def record(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "experiment.json").read_text())


def all_ok(results: list[dict]) -> None:
    for rank, result in enumerate(results):
        assert result["status"] == 0, f"process {rank}: {result['err']}"


def all_refused(results: list[dict], code: str) -> list[str]:
    """Every process exits 2 with `code` and no traceback; their messages."""
    messages = []
    for rank, result in enumerate(results):
        assert result["status"] == 2 and f"error {code}:" in result["err"], f"process {rank}: {result['err']}"
        assert "Traceback" not in result["err"]
        messages.append(result["err"])
    return messages


def line(report: str, label: str) -> str:
    return next(text for text in report.splitlines() if text.strip().startswith(label))[20 + 2:]


# --- the runs -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def alone(folder) -> dict:
    """The one-process runs the worlds are compared with."""
    file = tiny(folder / "alone")
    long_file = tiny(folder / "alone-long", BF16_STEPS, 5)
    return {"run": in_process("run", file, "--device", "cpu", "--run-dir", folder / "alone/run"),
            "dir": folder / "alone/run",
            "long": in_process("run", long_file, "--device", "cpu", "--run-dir", folder / "alone-long/run"),
            "long_dir": folder / "alone-long/run"}


@pytest.fixture(scope="module")
def torchrun_two(folder) -> subprocess.CompletedProcess:
    """The documented command, through torchrun, in a folder holding the cut ladder file."""
    here = folder / "torchrun"
    tiny(here)
    argv = DOCUMENTED.split()
    environment = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(ROOT / "src"))
    command = in_loopback_namespace([sys.executable, "-m", "torch.distributed.run", *argv[1:]])
    if command is None:
        pytest.skip("no network namespace of loopback alone can be made here, and torchrun's store would "
                    "listen on every interface")
    return subprocess.run(command, cwd=here, env=environment, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def f32_world(folder) -> dict:
    """2 nodes of 2 processes with float32 between them: a run, and a resume from its step 3."""
    file = tiny(folder / "f32")
    f32 = {"env": {"SEXPGPU_NODE_GRADIENTS": "f32"}, "nodes": 2, "per_node": 2}
    run_dir = folder / "f32/run"
    ran = world(folder / "f32/world", "run", file, "--device", "cpu", "--run-dir", run_dir, **f32)
    resumed = world(folder / "f32/resumed-world", "run", file, "--device", "cpu", "--run-dir", folder / "f32/resumed",
                    "--resume", run_dir / f"step-{EVERY}", **f32)
    return {"ran": ran, "dir": run_dir, "resumed": resumed, "resumed_dir": folder / "f32/resumed", "file": file}


@pytest.fixture(scope="module")
def bf16_world(folder) -> dict:
    """2 nodes of 1 process with bf16 between them (the default): a run, a resume from step
    5, and a resume asked to send float32, which its checkpoint's choices refuse."""
    file = tiny(folder / "bf16", BF16_STEPS, 5)
    run_dir = folder / "bf16/run"
    two_nodes = {"nodes": 2, "per_node": 1}
    ran = world(folder / "bf16/world", "run", file, "--device", "cpu", "--run-dir", run_dir, **two_nodes)
    f32 = world(folder / "bf16/f32-run-world", "run", file, "--device", "cpu", "--run-dir", folder / "bf16/f32",
                env={"SEXPGPU_NODE_GRADIENTS": "f32"}, **two_nodes)
    resume = ("run", file, "--device", "cpu", "--resume", run_dir / "step-5")
    resumed = world(folder / "bf16/resumed-world", *resume, "--run-dir", folder / "bf16/resumed", **two_nodes)
    as_f32 = world(folder / "bf16/f32-world", *resume, "--run-dir", folder / "bf16/as-f32",
                   env={"SEXPGPU_NODE_GRADIENTS": "f32"}, **two_nodes)
    return {"ran": ran, "dir": run_dir, "resumed": resumed, "resumed_dir": folder / "bf16/resumed", "as_f32": as_f32,
            "f32": f32, "f32_dir": folder / "bf16/f32"}


@pytest.fixture(scope="module")
def exact_worlds(folder) -> dict:
    """tiny-adam under :arithmetic exact, 4 microbatches of 8 for 2 steps, on 1 process, on 2,
    and on 2 nodes of 2 (bf16 between them, the default, which exact sums leave alone)."""
    exact = ((":batch 16", ":batch 8"), (":microbatches 4", ":microbatches 4 :arithmetic exact"),
             ("(eval :every 1", "(eval :every 2"))
    file = tiny(folder / "exact", 2, 1, exact)
    runs = {1: in_process("run", file, "--device", "cpu", "--run-dir", folder / "exact/1")}
    runs[2] = world(folder / "exact/world-2", "run", file, "--device", "cpu", "--run-dir", folder / "exact/2",
                    per_node=2)
    runs[4] = world(folder / "exact/world-4", "run", file, "--device", "cpu", "--run-dir", folder / "exact/4",
                    nodes=2, per_node=2)
    return {"runs": runs, "dirs": {size: folder / f"exact/{size}" for size in runs}, "file": file}


# --- through torchrun ---------------------------------------------------------------------

def test_the_documented_torchrun_command_trains_with_process_0_writing(torchrun_two, folder, alone):
    assert DOCUMENTED in DOCS.read_text()
    assert torchrun_two.returncode == 0, torchrun_two.stderr[-3000:]
    run_dir = folder / "torchrun/runs/two"
    assert sorted(path.name for path in (folder / "torchrun/runs").iterdir()) == ["two"]  # one directory, process 0's
    assert torchrun_two.stdout.count("determinism ") == 1  # one report
    report = (run_dir / "report.txt").read_text()
    assert "its 2 processes add their gradients in rank order" in line(report, "determinism")
    assert line(report, "choices").endswith(", 2 processes on 1 node")
    checkpoint = record(run_dir / f"step-{STEPS}")
    assert checkpoint["world_size"] == 2 and checkpoint["microbatches"] == 4
    assert checkpoint["choices"]["device"].endswith(", 2 processes on 1 node")
    # microbatches 0 and 1 on process 0, 2 and 3 on process 1: (g0 + g1) + (g2 + g3), where
    # one process sums ((g0 + g1) + g2) + g3; the first step's loss is the same either way
    ours, theirs = steps_of(run_dir), steps_of(alone["dir"])
    assert ours[0]["loss_bits"] == theirs[0]["loss_bits"] and ours[0]["digest"] != theirs[0]["digest"]


def test_the_python_api_under_a_world_trains_as_the_command_and_every_process_gets_the_result(folder):
    """sexpgpu.train on 2 processes of one node: the run directory process 0 writes holds the
    command's bits for the same world, and every process returns the RunResult read from it
    once the run has ended (docs/api.md)."""
    file = tiny(folder / "api")
    command = world(folder / "api/command-world", "run", file, "--device", "cpu", "--run-dir", folder / "api/command",
                    per_node=2)
    all_ok(command)
    out_dir = folder / "api/world"
    out_dir.mkdir()
    spec = Launch((str(file), str(folder / "api/run")), per_node=2)
    results = run_world(spec.size, out_dir, 240.0, partial(train_rank, spec))
    assert steps_of(folder / "api/run") == steps_of(folder / "api/command")
    want = [line for line in steps_of(folder / "api/command") if "loss_bits" in line]  # the training records
    for result in results:
        assert result["run_dir"] == str(folder / "api/run") and result["step"] == STEPS
        assert [(step["loss_bits"], step["digest"]) for step in result["metrics"]] == \
            [(step["loss_bits"], step["digest"]) for step in want]
        assert result["checkpoints"] == [EVERY, STEPS]
        assert "its 2 processes add their gradients in rank order" in result["determinism"]


# --- two nodes, float32 between them --------------------------------------------------------

def test_two_nodes_at_f32_agree_with_torchrun_and_a_resume_repeats_their_bits(f32_world, torchrun_two, folder):
    all_ok(f32_world["ran"])
    all_ok(f32_world["resumed"])
    assert [result["out"] for result in f32_world["ran"][1:]] == ["", "", ""]  # process 0 alone reports
    # every process compared its digest with the others' at every step and found them alike;
    # (g0 + g1) + (g2 + g3), node by node, is what one node of 2 processes sums
    ran = steps_of(f32_world["dir"])
    assert ran == steps_of(folder / "torchrun/runs/two")
    report = (f32_world["dir"] / "report.txt").read_text()
    assert "in node order between them, in float32" in line(report, "determinism")
    assert record(f32_world["dir"] / f"step-{STEPS}")["choices"]["device"].endswith(", 4 processes on 2 nodes")
    # the world as fields, not only inside the device's words: in each checkpoint and the run directory
    assert record(f32_world["dir"] / f"step-{STEPS}")["world"] == {"processes": 4, "nodes": 2}
    assert json.loads((f32_world["dir"] / "experiment.json").read_text())["world"] == {"processes": 4, "nodes": 2}
    # the resume from step 3 logs steps 4.. with the bits of the run it continues
    assert steps_of(f32_world["resumed_dir"]) == [entry for entry in ran if entry["step"] > EVERY]
    assert tensor_bits(f32_world["resumed_dir"] / f"step-{STEPS}") == tensor_bits(f32_world["dir"] / f"step-{STEPS}")


def test_a_resume_or_a_replay_on_another_number_of_processes_is_refused(f32_world, folder, monkeypatch):
    monkeypatch.setenv("SEXPGPU_NODE_GRADIENTS", "f32")  # as the checkpoint's choices record
    checkpoint = f32_world["dir"] / f"step-{EVERY}"
    refused = in_process("run", f32_world["file"], "--device", "cpu", "--run-dir", folder / "f32/alone",
                         "--resume", checkpoint)
    assert refused["status"] == 2 and "error E-RESUME-001:" in refused["err"]
    assert "4 microbatches a step on 4 process(es); this run has 4 on 1" in refused["err"]
    replayed = in_process("replay", checkpoint, "--device", "cpu")
    assert replayed["status"] == 2 and "E-EVAL-008" in replayed["err"] and "on 4 processes" in replayed["err"]
    allowed = in_process("run", f32_world["file"], "--device", "cpu", "--run-dir", folder / "f32/alone",
                         "--resume", checkpoint, "--allow-layout-change")
    assert allowed["status"] == 0 and "bits will differ" in allowed["out"], allowed["err"]


# --- two nodes, bf16 between them -----------------------------------------------------------

def test_bf16_between_nodes_stays_in_its_envelope_and_a_resume_is_a_rounding_away(bf16_world, alone):
    for results in (bf16_world["ran"], bf16_world["f32"], bf16_world["resumed"]):
        all_ok(results)
    ran, f32 = steps_of(bf16_world["dir"]), steps_of(bf16_world["f32_dir"])
    losses = {entry["step"]: entry["loss"] for entry in ran if "digest" in entry}
    assert sorted(losses) == list(range(1, BF16_STEPS + 1))
    assert ran[0]["loss_bits"] == f32[0]["loss_bits"]  # the same parameters meet the first step
    assert ran[0]["digest"] != f32[0]["digest"]  # the same grouping, but the first update read rounded gradients
    resumed = {entry["step"]: entry for entry in steps_of(bf16_world["resumed_dir"]) if "digest" in entry}
    assert sorted(resumed) == list(range(6, BF16_STEPS + 1))
    for reference in (f32, steps_of(alone["long_dir"])):  # the same nodes at f32, and one process
        wanted = {entry["step"]: entry["loss"] for entry in reference if "digest" in entry}
        for run in (losses, {step: entry["loss"] for step, entry in resumed.items()}):
            worst = max(abs(run[step] - wanted[step]) / abs(wanted[step]) for step in run)
            assert worst <= BF16_ENVELOPE, worst
    report = (bf16_world["dir"] / "report.txt").read_text()
    assert "a resume is one step's rounding away from the uninterrupted run" in line(report, "determinism")
    # the resume starts without the error the nodes carried: the same loss at step 6, from the
    # same parameters, and another update, which shows that the carry was in use
    uninterrupted = {entry["step"]: entry for entry in ran if "digest" in entry}
    assert resumed[6]["loss_bits"] == uninterrupted[6]["loss_bits"]
    assert resumed[6]["digest"] != uninterrupted[6]["digest"]
    resumed_report = (bf16_world["resumed_dir"] / "report.txt").read_text()
    assert "this resume started without it" in line(resumed_report, "determinism")


def test_a_pin_to_other_node_gradients_is_refused_on_every_process(bf16_world):
    for message in all_refused(bf16_world["as_f32"], "E-CHOICE-001"):
        assert "gradients between nodes were bf16, and SEXPGPU_NODE_GRADIENTS says f32" in message


def test_the_error_feedback_carries_what_bf16_dropped():
    gradient = torch.tensor([1.0 + 2 ** -10, -3.0, 1e-3], dtype=torch.float32)
    sent, carried = rounded_with_carry(gradient, None)
    assert sent.dtype == torch.bfloat16 and torch.equal(sent.float() + carried, gradient)
    # over steps the sent values add up to the true sum, less only the last carry
    total_sent, carried = torch.zeros(3, dtype=torch.float64), None
    for _ in range(64):
        sent, carried = rounded_with_carry(gradient, carried)
        total_sent += sent.double()
    assert torch.allclose(total_sent + carried.double(), 64 * gradient.double(), rtol=0, atol=1e-4)
    assert not torch.allclose(64 * gradient.to(torch.bfloat16).double(), 64 * gradient.double(), rtol=0, atol=1e-2)


# --- exact arithmetic -----------------------------------------------------------------------

def test_an_exact_run_has_the_same_bits_on_1_2_and_4_processes(exact_worlds, folder):
    runs, dirs = exact_worlds["runs"], exact_worlds["dirs"]
    assert runs[1]["status"] == 0, runs[1]["err"]
    all_ok(runs[2])
    all_ok(runs[4])
    logs = {size: (dirs[size] / "metrics.jsonl").read_bytes() for size in dirs}
    assert logs[2] == logs[1] and logs[4] == logs[1]
    for name in ("model.safetensors", "optimizer.safetensors"):
        files = {size: (dirs[size] / "step-2" / name).read_bytes() for size in dirs}
        assert files[2] == files[1] and files[4] == files[1], name
    report = (dirs[4] / "report.txt").read_text()
    assert "sum their accumulators exactly, so their number changes no bit" in line(report, "determinism")
    assert line(report, "choices").endswith("; on 4 processes on 2 nodes, whose number changes no bit")
    # and so a replay on one process repeats the steps of 4, and a resume continues with their bits
    replayed = in_process("replay", dirs[4] / "step-1", "--device", "cpu")
    assert replayed["status"] == 0 and "every step's loss bits and digest match" in replayed["out"], replayed["err"]
    resumed = in_process("run", exact_worlds["file"], "--device", "cpu", "--run-dir", folder / "exact/resumed",
                         "--resume", dirs[4] / "step-1")
    assert resumed["status"] == 0, resumed["err"]
    assert steps_of(folder / "exact/resumed") == [entry for entry in steps_of(dirs[1]) if entry["step"] > 1]


# --- refusals on every process --------------------------------------------------------------

def test_deterministic_with_bf16_node_gradients_is_refused_on_every_process(folder):
    file = tiny(folder / "strict")
    results = world(folder / "strict/world", "run", file, "--device", "cpu", "--deterministic",
                    env={"SEXPGPU_NODE_GRADIENTS": "bf16"}, nodes=2, per_node=1)
    all_refused(results, "E-CHOICE-002")


def test_parameters_that_differ_between_processes_stop_every_process(folder):
    file = tiny(folder / "corrupt")
    run_dir = folder / "corrupt/run"
    results = world(folder / "corrupt/world", "run", file, "--device", "cpu", "--run-dir", run_dir, per_node=2,
                    corrupt=1)
    for message in all_refused(results, "E-DIST-006"):
        assert f"after step {CORRUPTED_AFTER} the parameters of process(es) 1 are not the same bits" in message
    assert [entry["step"] for entry in steps_of(run_dir)] == [1]  # the step that differs is not logged


@pytest.mark.parametrize("setting", [{"SEXPGPU_NODE_GRADIENTS": "f32"}, {"SEXPGPU_NONFINITE": "continue"}])
def test_processes_started_otherwise_are_refused(folder, setting):
    unlike = folder / f"unlike-{next(iter(setting))}"
    file = tiny(unlike)
    results = world(unlike / "world", "run", file, "--device", "cpu", "--run-dir", unlike / "run",
                    nodes=2, rank_env={1: setting})
    for message in all_refused(results, "E-DIST-005"):
        assert "the run and its settings of process(es) 1 differ from process 0's" in message


def test_a_loss_that_is_not_finite_stops_every_process_alike(folder):
    run_dir = folder / "diverging/run"
    results = world(folder / "diverging/world", "run", tiny(folder / "diverging", steps=4, every=1,
                                                            edits=(("(adam :lr 0.01)", "(adam :lr 1e30)"),)),
                    "--device", "cpu", "--run-dir", run_dir, per_node=2)
    messages = all_refused(results, "E-NUM-001")
    said = [message.strip().splitlines()[-1] for message in messages]  # process 0 prints its progress before
    assert all(text == said[0] and text.startswith("error E-NUM-001: step 2's loss is not finite") for text in said)
    assert [entry["step"] for entry in steps_of(run_dir) if "digest" in entry] == [1]
    assert (run_dir / "step-1").is_dir() and not (run_dir / "step-2").exists()


def test_a_refusal_on_process_0_stops_the_others_with_its_code(folder, alone):
    results = world(folder / "taken/world", "run", tiny(folder / "taken"), "--device", "cpu", "--run-dir", alone["dir"],
                    per_node=2)
    first, other = all_refused(results, "E-RUN-001")
    assert "process 0 stopped while setting the run up" in other and "process 0" not in first


def test_a_process_whose_others_never_come_stops_with_a_code(folder):
    lonely = Launch(("run", str(tiny(folder / "lonely")), "--device", "cpu"), per_node=2,
                    env={"SEXPGPU_DIST_TIMEOUT": "1"})
    (folder / "lonely/world").mkdir()
    results = run_world(1, folder / "lonely/world", 60.0, partial(run_rank, lonely))  # process 0 of 2 alone
    message, = all_refused(results, "E-DIST-004")
    assert "process 0 of 2 failed joining the other processes" in message


# --- the environment ----------------------------------------------------------------------

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_the_environment_torchrun_gives_is_this_processs_world():
    assert World.from_environment({}) is World.SOLO and not World.SOLO.distributed
    found = World.from_environment(TORCHRUN)
    assert (found.rank, found.size, found.local_rank, found.local_size, found.node, found.nodes) == (3, 4, 1, 2, 1, 2)
    assert found.meeting == "env://" and found.share(8) == range(6, 8) and found.described("cuda") == "4 GPUs on 2 nodes"


@pytest.mark.parametrize("change, says", [
    ({"WORLD_SIZE": "four"}, "WORLD_SIZE is 'four', where a run of several processes needs a whole number"),
    ({"RANK": "4"}, "RANK 4 is not below WORLD_SIZE 4"),
    ({"LOCAL_RANK": "2"}, "LOCAL_RANK 2 is not below LOCAL_WORLD_SIZE 2"),
    ({"LOCAL_WORLD_SIZE": "3"}, "WORLD_SIZE 4 is not a multiple of LOCAL_WORLD_SIZE 3"),
    ({"GROUP_RANK": "0"}, "ranks must be numbered node by node"),
    ({"LOCAL_RANK": None}, "LOCAL_RANK is unset"),
    ({"MASTER_PORT": "http"}, "MASTER_ADDR and MASTER_PORT must name where the processes meet"),
])
def test_an_environment_that_describes_no_world_is_refused(change, says):
    environ = {name: value for name, value in {**TORCHRUN, **change}.items() if value is not None}
    with pytest.raises(SexpgpuError) as refused:
        World.from_environment(environ)
    assert refused.value.code == "E-DIST-001" and says in refused.value.message


def test_a_bad_environment_and_an_uneven_share_exit_2_before_any_process_group(monkeypatch, folder):
    file = tiny(folder / "uneven")
    monkeypatch.setenv("WORLD_SIZE", "two")
    broken = in_process("run", file, "--device", "cpu")
    assert broken["status"] == 2 and "error E-DIST-001:" in broken["err"] and "Traceback" not in broken["err"]
    monkeypatch.setenv("WORLD_SIZE", "3")
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    uneven = in_process("run", file, "--device", "cpu")
    assert uneven["status"] == 2 and "E-DIST-002" in uneven["err"]
    assert "4 microbatches a step do not divide among 3 processes" in uneven["err"]
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("facts, says", [
    (GroupFacts(None, 8, ("gloo",), "2.13.0"), "this torch (2.13.0) has no nccl"),
    (GroupFacts(None, 1, ("gloo", "nccl"), "2.13.0"), "LOCAL_RANK 1 has no GPU of its own: this node shows 1"),
    (GroupFacts("no CUDA GPU is visible", 0, (), ""), "torch.distributed cannot be imported"),
])
def test_a_device_the_process_group_cannot_use_is_refused(facts, says):
    device = "cpu" if facts.cuda_problem else "cuda"
    with pytest.raises(SexpgpuError) as refused:
        process_device(World.from_environment(TORCHRUN), device, facts)
    assert refused.value.code == "E-DIST-003" and says in refused.value.message
    assert BACKENDS[device] in refused.value.message


def test_on_several_gpus_products_are_ordinary_and_a_process_stacks_its_share(folder, monkeypatch):
    from fake_device import FakeDevice
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run import choosing
    from sexpgpu.run.setup import build_run

    device = FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5})  # split-k would win if timed
    monkeypatch.setattr(choosing, "backend_probe", lambda backend: device)
    built = build_run(load_experiment(str(tiny(folder / "choosing")), None), "cpu")
    two = World.from_environment({**TORCHRUN, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "GROUP_RANK": "0"})
    chosen = choosing.choose(built, choosing.ChoiceSettings(), None, dict, two)
    assert set(chosen.choices.products.values()) == {"ordinary"} and not [m for m in device.measured if m[0] == "product"]
    assert "stacking degrees 1, 2 fit" in " ".join(chosen.notes)  # the divisors of its 2 microbatches, not of 4
    assert chosen.choices.device.endswith(", 2 processes on 1 node")


def test_one_process_imports_no_torch(folder):
    file = tiny(folder / "plain")
    probe = ("import sys; from sexpgpu.cli.main import main; status = main(sys.argv[1:]); "
             "print('torch' in sys.modules); sys.exit(status)")
    environment = {name: value for name, value in os.environ.items() if name not in TORCHRUN}
    result = subprocess.run([sys.executable, "-c", probe, "run", str(file), "--device", "cpu", "--run-dir",
                             str(folder / "plain/run")], env=dict(environment, PYTHONPATH=str(ROOT / "src")),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("False")


def test_every_distribution_code_is_documented_and_triggered():
    code = re.compile(r"E-DIST-\d{3}")
    section = (ROOT / "docs/errors.md").read_text().split("## Several processes\n", 1)[1].split("\n## ", 1)[0]
    documented = {code.match(row[2:]).group(0) for row in section.splitlines() if row.startswith("| E-")}
    raised = {found for path in (ROOT / "src/sexpgpu").rglob("*.py") for found in code.findall(path.read_text())}
    assert raised == documented == {f"E-DIST-00{number}" for number in range(1, 7)}
    tests = Path(__file__).read_text()
    assert all(f'"{found}"' in tests for found in documented)
