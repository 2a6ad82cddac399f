"""The Python API of docs/api.md, each call against an oracle of its own: `train` against the
run directory's files parsed here and against `sexpgpu run`'s bytes; `open_checkpoint`
against the `safetensors` library reading the same files; `compare` against `sexpgpu diff`'s
exit status and JSON. Bad input raises SexpgpuError with the command's code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import sexpgpu
from sexpgpu.cli.main import main
from sexpgpu.errors import SexpgpuError
from sexpgpu.run.loop import Trainer
from sexpgpu.store import write_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def cli(capsys, *argv) -> tuple:
    """(exit status, stdout, stderr) of `sexpgpu ARGV...` in this process."""
    capsys.readouterr()
    status = main([str(arg) for arg in argv])
    return status, *capsys.readouterr()


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def trained(tiny, tmp_path) -> sexpgpu.RunResult:
    return sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "a")


# --- import -------------------------------------------------------------------------------

def test_importing_sexpgpu_imports_neither_torch_nor_numpy():
    code = "import sys, sexpgpu; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONPATH": str(ROOT / "src")})
    assert found.stdout.strip() == "[]"


def test_every_public_name_has_its_section_in_docs_api_md():
    sections = {line.removeprefix("## ").split("(")[0].strip("`").removeprefix("sexpgpu.")
                for line in (ROOT / "docs" / "api.md").read_text().splitlines() if line.startswith("## `")}
    assert sections == set(sexpgpu.__all__) - {"__version__"}


# --- train --------------------------------------------------------------------------------

def test_train_returns_what_the_run_directory_holds(trained, tmp_path):
    folder = tmp_path / "a"
    logged = lines_of(folder / "metrics.jsonl")
    steps = [record for record in logged if "digest" in record]
    assert trained.run_dir == folder and trained.step == 6 and trained.stopped_by is None
    assert list(trained.metrics) == steps and [record["step"] for record in steps] == [1, 2, 3, 4, 5, 6]
    assert list(trained.evaluations) == [record for record in logged if "digest" not in record]
    assert trained.digest == steps[-1]["digest"]
    assert trained.checkpoints == {step: str(folder / f"step-{step}") for step in (3, 6)}
    assert all((folder / f"step-{step}" / "COMMITTED").is_file() for step in (3, 6))
    report = (folder / "report.txt").read_text()
    assert f"  determinism         {trained.determinism}\n" in report
    assert trained.choices == json.loads((folder / "experiment.json").read_text())["choices"]
    with pytest.raises(AttributeError):
        trained.step = 7  # a frozen record


def test_train_writes_the_bytes_sexpgpu_run_writes(trained, tiny, tmp_path, capsys):
    status, _, _ = cli(capsys, "run", tiny, "--device", "cpu", "--run-dir", tmp_path / "b")
    assert status == 0
    files = {folder: {path.relative_to(folder): path.read_bytes() for path in sorted(folder.rglob("*"))
                      if path.is_file() and path.name != "run.lock"} for folder in (tmp_path / "a", tmp_path / "b")}
    assert files[tmp_path / "a"] == files[tmp_path / "b"]
    assert Path("step-6/model.safetensors") in files[tmp_path / "a"]


def test_train_resumes_and_sends_checkpoints_elsewhere(trained, tiny, tmp_path):
    resumed = sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "a", resume=trained.checkpoints[3])
    assert resumed.metrics == trained.metrics and resumed.digest == trained.digest
    elsewhere = sexpgpu.train(tiny, "tiny-adam", device="cpu", run_dir=tmp_path / "c",
                              checkpoint_to=tmp_path / "elsewhere", deterministic=True)
    assert elsewhere.checkpoints == {step: str(tmp_path / "elsewhere" / f"step-{step}") for step in (3, 6)}
    flags = json.loads((tmp_path / "c" / "experiment.json").read_text())["flags"]
    assert flags["device"] == "cpu" and flags["choices"]["deterministic"] is True
    assert elsewhere.digest == trained.digest  # the interpreter chooses nothing, so the rule changes no bit
    assert sexpgpu.compare(trained, elsewhere).checkpoint_step == 6  # found where the record says they went


def test_train_finds_the_checkpoints_the_file_s_to_sends_elsewhere(tiny, tmp_path):
    sent = tmp_path / "sent.sexp"
    sent.write_text(tiny.read_text().replace(":checkpoint 3", ':checkpoint (every 3 :to "kept")'))
    result = sexpgpu.train(sent, device="cpu", run_dir=tmp_path / "r")
    assert result.checkpoints == {step: str(tmp_path / "kept" / f"step-{step}") for step in (3, 6)}


@pytest.mark.parametrize("call, code", [
    (lambda tiny, folder: sexpgpu.train(folder / "missing.sexp", device="cpu"), "E-FILE-001"),
    (lambda tiny, folder: sexpgpu.train(tiny, "tiyn", device="cpu", run_dir=folder / "r"), "E-SELECT-001"),
    (lambda tiny, folder: sexpgpu.train(tiny, device="tpu", run_dir=folder / "r"), "E-CLI-002"),
    (lambda tiny, folder: sexpgpu.train(tiny, device="cpu", run_dir=folder / "r", resume="latest"), "E-CKPT-003"),
])
def test_train_raises_the_command_s_code_and_leaves_nothing(call, code, tiny, tmp_path, capsys):
    with pytest.raises(SexpgpuError) as raised:
        call(tiny, tmp_path)
    assert raised.value.code == code
    assert not (tmp_path / "r").exists()


def test_train_names_a_file_s_error_where_it_is(tmp_path):
    path = tmp_path / "unclosed.sexp"
    path.write_text("(defrun tiny :seed 1\n")
    with pytest.raises(SexpgpuError) as raised:
        sexpgpu.train(path, device="cpu", run_dir=tmp_path / "r")
    assert raised.value.code == "E-READ-001"
    assert (raised.value.location.line, raised.value.location.column) == (1, 1)


def test_a_run_stopped_by_ctrl_c_returns_what_it_finished(tiny, tmp_path, monkeypatch, capsys):
    step = Trainer.step

    def interrupted_after_the_first(trainer, state):
        if state.step == 3:
            raise KeyboardInterrupt
        return step(trainer, state)

    monkeypatch.setattr(Trainer, "step", interrupted_after_the_first)
    stopped = sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "r")
    assert stopped.stopped_by == "Ctrl-C" and stopped.step == 3 and len(stopped.metrics) == 3
    assert stopped.checkpoints == {3: str(tmp_path / "r" / "step-3")}


def test_a_run_stopped_while_it_is_set_up_raises_keyboard_interrupt(tiny, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("sexpgpu.run.session.build_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "r")


def test_train_checks_the_environment_first(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SEXPGPU_OPTIMIZE", "max")
    with pytest.raises(SexpgpuError) as raised:
        sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "r")
    assert raised.value.code == "E-CONFIG-001" and not (tmp_path / "r").exists()
    monkeypatch.delenv("SEXPGPU_OPTIMIZE")
    monkeypatch.setenv("SEXPGPU_OPTIMISE", "off")
    with pytest.warns(UserWarning, match="SEXPGPU_OPTIMISE is not a setting sexpgpu knows"):
        sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "r")


# --- open_checkpoint ----------------------------------------------------------------------

def as_named(folder: Path, load) -> dict:
    """The checkpoint's tensors as the safetensors library reads its two files, named as the API names them."""
    model = {f"param/{name}": tensor for name, tensor in load(str(folder / "model.safetensors")).items()}
    return {**model, **load(str(folder / "optimizer.safetensors"))}


def test_open_checkpoint_gives_what_the_safetensors_library_reads(trained):
    folder = Path(trained.checkpoints[6])
    arrays, tensors = sexpgpu.open_checkpoint(folder), sexpgpu.open_checkpoint(str(folder), framework="torch")
    expected_arrays, expected_tensors = as_named(folder, safetensors.numpy.load_file), \
        as_named(folder, safetensors.torch.load_file)
    assert list(arrays) == sorted(expected_arrays) == list(tensors)
    assert {name for name in arrays if name.startswith("param/")} == {"param/fc1/w", "param/fc1/b", "param/fc2/w",
                                                                      "param/fc2/b", "param/head/w", "param/head/b"}
    for name, array in arrays.items():
        assert isinstance(array, np.ndarray) and array.dtype == expected_arrays[name].dtype
        assert array.tobytes() == expected_arrays[name].tobytes()
        assert tensors[name].dtype == expected_tensors[name].dtype
        assert torch.equal(tensors[name], expected_tensors[name])


def test_open_checkpoint_gives_a_bf16_tensor_as_torch_bfloat16(tmp_path):
    values = torch.randn(4, 3, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    write_checkpoint(str(tmp_path), 1, {"param/w": values.float().numpy(), "state/m/w": np.ones(3, np.float32)}, {},
                     bf16=["param/w"])
    stored = safetensors.torch.load_file(str(tmp_path / "step-1" / "model.safetensors"))["w"]
    assert stored.dtype == torch.bfloat16  # the oracle reads BF16, as it was written
    tensors = sexpgpu.open_checkpoint(tmp_path / "step-1", framework="torch")
    assert tensors["param/w"].dtype == torch.bfloat16 and torch.equal(tensors["param/w"], stored)
    arrays = sexpgpu.open_checkpoint(tmp_path / "step-1")
    assert arrays["param/w"].dtype == np.float32 and np.array_equal(arrays["param/w"], stored.float().numpy())


def test_open_checkpoint_verifies_every_digest(trained):
    model = Path(trained.checkpoints[3]) / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 1  # one bit of the last tensor
    model.write_bytes(bytes(data))
    with pytest.raises(SexpgpuError) as raised:
        sexpgpu.open_checkpoint(trained.checkpoints[3])
    assert raised.value.code == "E-CKPT-001" and "SHA-256" in raised.value.message


def test_open_checkpoint_refuses_bad_input_with_codes(trained, monkeypatch):
    cases = [(lambda: sexpgpu.open_checkpoint(trained.run_dir / "step-9"), "E-CKPT-003"),
             (lambda: sexpgpu.open_checkpoint(trained.run_dir), "E-CKPT-003"),
             (lambda: sexpgpu.open_checkpoint(trained.checkpoints[3], framework="jax"), "E-API-001")]
    for call, code in cases:
        with pytest.raises(SexpgpuError) as raised:
            call()
        assert raised.value.code == code
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(SexpgpuError) as raised:
        sexpgpu.open_checkpoint(trained.checkpoints[3], framework="torch")
    assert raised.value.code == "E-API-002" and "sexpgpu[torch]" in raised.value.hint


def test_a_host_allocation_that_fails_is_e_mem_003(trained, monkeypatch):
    def out_of_memory(path):
        raise MemoryError("Unable to allocate 4.00 GiB")

    monkeypatch.setattr("sexpgpu.store.read_checkpoint", out_of_memory)
    with pytest.raises(SexpgpuError) as raised:
        sexpgpu.open_checkpoint(trained.checkpoints[3])
    assert raised.value.code == "E-MEM-003" and "while sexpgpu.open_checkpoint ran" in raised.value.message


def test_open_checkpoint_reads_an_s3_prefix(tiny, tmp_path, s3):
    written = sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "a", checkpoint_to=s3.uri("runs", "a"))
    assert written.checkpoints[6] == s3.uri("runs", "a", "step-6")
    local = sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "b")
    remote, here = sexpgpu.open_checkpoint(written.checkpoints[6]), sexpgpu.open_checkpoint(local.checkpoints[6])
    assert list(remote) == list(here)
    assert all(remote[name].tobytes() == here[name].tobytes() for name in here)


# --- compare ------------------------------------------------------------------------------

def test_compare_agrees_with_sexpgpu_diff_on_identical_runs(trained, tiny, tmp_path, capsys):
    again = sexpgpu.train(tiny, device="cpu", run_dir=tmp_path / "b")
    status, out, _ = cli(capsys, "diff", tmp_path / "a", tmp_path / "b", "--json")
    for a, b in ((trained, again), (tmp_path / "a", str(tmp_path / "b")), (trained, tmp_path / "b" / "metrics.jsonl")):
        found = sexpgpu.compare(a, b)
        assert found.identical and status == 0
    assert sexpgpu.compare(trained, again).to_json() == json.loads(out)


def test_compare_names_the_first_step_and_parameter_where_runs_part(trained, tiny, tmp_path, capsys):
    other = tmp_path / "other.sexp"
    other.write_text(tiny.read_text().replace("(adam :lr 0.01)", "(adam :lr 0.02)"))
    sexpgpu.train(other, device="cpu", run_dir=tmp_path / "b")
    found = sexpgpu.compare(trained, tmp_path / "b")
    status, out, _ = cli(capsys, "diff", tmp_path / "a", tmp_path / "b", "--json")
    assert status == 1 and not found.identical and found.to_json() == json.loads(out)
    # the first step's loss is computed before its update: the parameters part there, the loss a step later
    assert found.first_step == 1 and found.first_step_parts == ["digest"]
    assert found.checkpoint_step == 3 and found.tensors[0].name == "param/fc1/b"
    assert "experiment.run.optimizer.lr" in [key for key, _, _ in found.records]


def test_compare_refuses_what_is_not_a_run_with_the_line_sexpgpu_diff_prints(trained, tmp_path, capsys):
    with pytest.raises(SexpgpuError) as raised:
        sexpgpu.compare(trained, tmp_path / "missing")
    status, _, err = cli(capsys, "diff", trained.run_dir, tmp_path / "missing")
    assert raised.value.code == "E-DIFF-001" and status == 2 and err == str(raised.value) + "\n"
