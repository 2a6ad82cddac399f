"""The machine's choices end to end through `sexpgpu.cli.main.main`: recorded in the run
directory, the lowering annotation, each checkpoint and the report; pinned with --choices, by
a resume and by SEXPGPU_CHOICES; refused as the spec says. The CPU interpreter runs the steps;
where a test needs a device that decides, tests/fake_device.py's takes the GPU's place
(determinism.md, "Which flag, when", "The three levels", "Pinning a run to recorded choices")."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from sexpgpu.backends.cpu import Interpreter
from sexpgpu.backends.cpu.facts import cpu_facts
from sexpgpu.cli.main import main
from sexpgpu.run import choosing, setup

from fake_device import GIB, H200, FakeDevice
from test_cli import EXAMPLES, metrics

SPLIT = {"ordinary": 1.0, "split-k 2": 0.5}


@pytest.fixture
def tiny(tmp_path) -> Path:
    """tiny-adam, 6 steps, a checkpoint every 3."""
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    text = text.replace(":steps 200", ":steps 6").replace(":checkpoint 100", ":checkpoint 3")
    text = text.replace(":every 50", ":every 3")
    path = tmp_path / "tiny.sexp"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    for name in ("SEXPGPU_CHOICES", "SEXPGPU_DETERMINISTIC", "SEXPGPU_NODE_GRADIENTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class Sexpgpu:
    def __init__(self, capsys, monkeypatch):
        self.capsys, self.monkeypatch = capsys, monkeypatch

    def __call__(self, *args, device=None):
        """(exit status, stdout, stderr); `device` stands in for the GPU."""
        self.monkeypatch.setattr(choosing, "backend_probe", lambda backend: device)
        self.capsys.readouterr()
        code = main([str(arg) for arg in args])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def sexpgpu(capsys, monkeypatch):
    return Sexpgpu(capsys, monkeypatch)


def line(report: str, label: str) -> str:
    found = [text[22:] for text in report.splitlines() if text.startswith(f"  {label:<20}")]
    assert found, f"no {label} line in:\n{report}"
    return found[-1]


def choices_of(path: Path) -> dict:
    return json.loads(path.read_text())["choices"]


def test_a_cpu_run_records_its_choices_everywhere_and_states_its_level(sexpgpu, tiny, tmp_path):
    code, out, _ = sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "r")
    assert code == 0
    assert line(out, "determinism").startswith("1 on every machine: the CPU interpreter decides nothing")
    assert line(out, "choices").startswith("stacking 1, no recomputation")
    recorded = choices_of(tmp_path / "r/experiment.json")
    assert recorded == choices_of(tmp_path / "r/step-3/experiment.json") == choices_of(tmp_path / "r/step-6/experiment.json")
    assert recorded["stacking"] == 1 and recorded["strict"] is False and recorded["node_gradients"] is None
    annotation = json.loads((tmp_path / "r/lowering.json").read_text())
    assert annotation["metadata"]["choices"] == recorded and annotation["text"] == out.rstrip("\n")
    code, shown, _ = sexpgpu("checkpoint", tmp_path / "r/step-3")
    assert code == 0 and f"choices     {json.dumps(recorded, sort_keys=True)}" in shown


def test_a_measured_choice_is_remembered_and_taken_again(sexpgpu, tiny, tmp_path, home):
    first = FakeDevice(product_seconds=SPLIT)
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "a", device=first)
    assert code == 0
    assert line(out, "determinism").startswith("1: this machine repeats these bits with this binary and ~/.cache/sexpgpu")
    assert "chosen now" in out and (home / ".cache/sexpgpu/choices.json").is_file()
    # the same machine, its timings now the other way round: the cache decides, not a new measurement
    second = FakeDevice(product_seconds={"ordinary": 0.5, "split-k 2": 1.0})
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "b", device=second)
    assert code == 0 and f"taken from {home}/.cache/sexpgpu" in out and "chosen now" not in out
    assert choices_of(tmp_path / "a/experiment.json") == choices_of(tmp_path / "b/experiment.json")
    assert set(choices_of(tmp_path / "b/experiment.json")["products"].values()) == {"split-k 2"}
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")


@pytest.mark.parametrize("record", ["experiment.json", "lowering.json", "step-3"])
def test_a_run_pinned_to_a_record_takes_it_and_measures_and_remembers_nothing(sexpgpu, tiny, tmp_path, home, record):
    code, _, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "theirs", device=FakeDevice(product_seconds=SPLIT))
    assert code == 0
    (home / ".cache").rename(tmp_path / "their-cache")  # the cache emptied in between
    mine = FakeDevice(product_seconds={"ordinary": 0.1, "split-k 2": 1.0})
    source = tmp_path / "theirs" / record
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "mine", "--choices", source, device=mine)
    assert code == 0
    assert line(out, "determinism").startswith(
        f"2: pinned to the choices of {source}, whose device facts read as this machine's")
    assert mine.measured == [] and not (home / ".cache").exists()
    assert choices_of(tmp_path / "mine/step-6/experiment.json") == choices_of(tmp_path / "theirs/experiment.json")
    assert metrics(tmp_path / "mine") == metrics(tmp_path / "theirs")


def test_SEXPGPU_CHOICES_pins_as_the_flag_does(sexpgpu, tiny, tmp_path, monkeypatch):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "theirs", device=FakeDevice(product_seconds=SPLIT))
    monkeypatch.setenv("SEXPGPU_CHOICES", str(tmp_path / "theirs/step-3"))
    mine = FakeDevice(product_seconds=SPLIT)
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "mine", device=mine)
    assert code == 0 and mine.measured == []
    assert line(out, "determinism").startswith(f"2: pinned to the choices of {tmp_path / 'theirs/step-3'}")


def test_a_pin_recorded_on_other_device_facts_is_level_3_naming_both(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "theirs", device=FakeDevice())
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "mine", "--choices", tmp_path / "theirs/experiment.json",
                           device=FakeDevice(facts=H200))
    level = line(out, "determinism")
    assert code == 0 and level.startswith("3: pinned")
    assert "compute_80 with 108 multiprocessors" in level and "compute_90 with 132 multiprocessors" in level


def test_a_pin_this_machine_cannot_take_stops_before_the_first_step(sexpgpu, tiny, tmp_path, capsys):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "theirs", device=FakeDevice(product_seconds=SPLIT))
    code, out, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "mine", "--choices", tmp_path / "theirs/step-3",
                             device=FakeDevice(product_seconds={"ordinary": 1.0, "transposed": 0.5}))
    assert code == 2 and "error E-CHOICE-001" in err and "does not offer 'split-k 2'" in err
    assert not (tmp_path / "mine/metrics.jsonl").exists()


@pytest.mark.parametrize("setting, recorded_dtype, device", [
    ("bf16", None, FakeDevice()), ("f32", None, FakeDevice()),
    # a checkpoint of an older sexpgpu, which recorded its setting on one node too
    ("f32", "bf16", FakeDevice()), ("bf16", "f32", FakeDevice()), ("f32", "bf16", None),
], ids=["bf16", "f32", "f32-old-bf16", "bf16-old-f32", "interpreter-f32-old-bf16"])
def test_a_one_node_resume_takes_its_checkpoint_under_either_node_gradients_setting(
        sexpgpu, tiny, tmp_path, monkeypatch, setting, recorded_dtype, device):
    """Gradients go between nodes only on several nodes: one node records null, and its resume
    is pinned (level 2) whatever SEXPGPU_NODE_GRADIENTS says, to the same bits."""
    sexpgpu("run", tiny, "--run-dir", tmp_path / "whole", device=device)
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=device)
    assert choices_of(tmp_path / "r/step-3/experiment.json")["node_gradients"] is None
    if recorded_dtype is not None:
        rewrite_record(tmp_path / "r/step-3", lambda record: record["choices"].update(node_gradients=recorded_dtype))
    shutil.rmtree(tmp_path / "r/step-6")
    monkeypatch.setenv("SEXPGPU_NODE_GRADIENTS", setting)
    code, out, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", "--resume", tmp_path / "r/step-3", device=device)
    assert code == 0, err
    if device is not None:
        assert line(out, "determinism").startswith("2: pinned to the choices of the checkpoint resumed from")
    assert choices_of(tmp_path / "r/step-6/experiment.json")["node_gradients"] is None
    assert "no gradients between nodes" in line(out, "choices") or device is None
    assert metrics(tmp_path / "r") == metrics(tmp_path / "whole")


def test_the_cpu_interpreter_refuses_a_stacked_pin(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "theirs")
    experiment = json.loads((tmp_path / "theirs/experiment.json").read_text())
    experiment["choices"]["stacking"] = 2
    (tmp_path / "stacked.json").write_text(json.dumps(experiment))
    code, _, err = sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "mine", "--choices",
                           tmp_path / "stacked.json")
    assert code == 2 and "E-CHOICE-001" in err and "the CPU interpreter runs unstacked" in err


# --- resumes -----------------------------------------------------------------------------

def test_a_resume_pins_itself_to_its_checkpoints_choices(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "whole", device=FakeDevice(product_seconds=SPLIT))
    sexpgpu("run", tiny, "--run-dir", tmp_path / "resumed", device=FakeDevice(product_seconds=SPLIT))
    shutil.rmtree(tmp_path / "resumed/step-6")  # as if preempted after step 3's checkpoint
    later = FakeDevice(product_seconds={"ordinary": 0.1, "split-k 2": 1.0})
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "resumed", "--resume", tmp_path / "resumed/step-3",
                           device=later)
    assert code == 0 and later.measured == []
    assert line(out, "determinism").startswith("2: pinned to the choices of the checkpoint resumed from")
    assert choices_of(tmp_path / "resumed/step-6/experiment.json") == choices_of(tmp_path / "whole/step-6/experiment.json")
    assert metrics(tmp_path / "resumed") == metrics(tmp_path / "whole")


def test_a_resume_on_a_card_that_cannot_take_its_choices_stops_and_fresh_continues(sexpgpu, tiny, tmp_path, monkeypatch):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice(product_seconds=SPLIT))
    other = FakeDevice(facts=H200, product_seconds={"ordinary": 1.0, "transposed": 0.5})
    code, _, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", "--resume", tmp_path / "r/step-3", device=other)
    assert code == 2 and "E-CHOICE-001" in err
    monkeypatch.setenv("SEXPGPU_CHOICES", "fresh")  # the spot-job row: not E-CKPT-002
    code, out, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r2", "--resume", tmp_path / "r/step-3", device=other)
    assert code == 0, err
    assert line(out, "determinism").startswith("3: this resume chose again (--choices fresh)")
    assert set(choices_of(tmp_path / "r2/step-6/experiment.json")["products"].values()) == {"transposed"}


def rewrite_record(step_dir: Path, change) -> None:
    """Make a checkpoint as an older sexpgpu wrote it: its experiment.json changed and its
    commit marker's digest of that file updated to match."""
    record = json.loads((step_dir / "experiment.json").read_text())
    change(record)
    data = json.dumps(record).encode()
    (step_dir / "experiment.json").write_bytes(data)
    marker = json.loads((step_dir / "COMMITTED").read_text())
    marker["experiment.json"] = dict(marker["experiment.json"], bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (step_dir / "COMMITTED").write_text(json.dumps(marker))


def test_a_checkpoint_without_choices_resumes_choosing_at_level_3(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice())
    rewrite_record(tmp_path / "r/step-3", lambda record: record.update(choices=None))
    code, shown, _ = sexpgpu("checkpoint", tmp_path / "r/step-3")
    assert "choices     none recorded" in shown
    code, out, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", "--resume", tmp_path / "r/step-3",
                             device=FakeDevice())
    assert code == 0, err
    assert line(out, "determinism").startswith("3: this resume chose again (its checkpoint records no choices)")


def test_a_checkpoint_without_products_resumes_with_ordinary_products(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice())
    rewrite_record(tmp_path / "r/step-3", lambda record: record["choices"].pop("products"))
    code, out, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r2", "--resume", tmp_path / "r/step-3",
                             device=FakeDevice(product_seconds=SPLIT))
    assert code == 0, err
    assert set(choices_of(tmp_path / "r2/step-6/experiment.json")["products"].values()) == {"ordinary"}


# --- --deterministic ---------------------------------------------------------------------

@pytest.mark.parametrize("how", ["flag", "variable"])
def test_deterministic_takes_the_last_column_and_measures_nothing(sexpgpu, tiny, tmp_path, monkeypatch, home, how):
    flags = ["--deterministic"] if how == "flag" else []
    if how == "variable":
        monkeypatch.setenv("SEXPGPU_DETERMINISTIC", "1")
    runs = []
    for name in ("a", "b"):
        device = FakeDevice(product_seconds=SPLIT)
        code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / name, *flags, device=device)
        assert code == 0 and device.measured == [] and not (home / ".cache").exists()
        assert line(out, "determinism").startswith("2: --deterministic")
        runs.append(metrics(tmp_path / name))
    recorded = choices_of(tmp_path / "a/step-6/experiment.json")
    assert (recorded["strict"], recorded["stacking"], recorded["recompute"], recorded["node_gradients"]) == \
        (True, 1, 9.0, None)  # none go between nodes on one node
    assert set(recorded["products"].values()) == {"ordinary"} and recorded["convolutions"] == {}
    assert runs[0] == runs[1]


def test_deterministic_refuses_a_record(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "theirs", device=FakeDevice())
    code, _, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "mine", "--deterministic", "--choices",
                           tmp_path / "theirs/experiment.json", device=FakeDevice())
    assert code == 2 and "error E-CHOICE-002" in err


@pytest.mark.parametrize("flags, variables", [
    (["--deterministic", "--choices", "fresh"], {}),
    (["--deterministic"], {"SEXPGPU_CHOICES": "fresh"}),
    (["--choices", "fresh"], {"SEXPGPU_DETERMINISTIC": "1"}),
    ([], {"SEXPGPU_DETERMINISTIC": "1", "SEXPGPU_CHOICES": " FRESH "}),
], ids=["flags", "deterministic-flag", "choices-flag", "variables"])
@pytest.mark.parametrize("device", [FakeDevice(), None], ids=["device", "interpreter"])
def test_deterministic_refuses_fresh_choices(sexpgpu, tiny, tmp_path, monkeypatch, flags, variables, device):
    """Fixed rules cannot also be chosen afresh: E-CHOICE-002 before any step, however asked."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    code, _, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", *flags, device=device)
    assert code == 2 and "error E-CHOICE-002: --deterministic takes fixed rules for every choice, so it cannot " \
                         "also choose them afresh here (--choices fresh)." in err
    assert not (tmp_path / "r/metrics.jsonl").exists()


@pytest.mark.parametrize("setting, refused", [("bf16", True), ("f32", False)])
def test_deterministic_refuses_bf16_between_nodes(sexpgpu, tiny, tmp_path, monkeypatch, setting, refused):
    monkeypatch.setenv("SEXPGPU_NODE_GRADIENTS", setting)
    code, _, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", "--deterministic", device=FakeDevice())
    assert (code == 2 and "error E-CHOICE-002" in err) if refused else code == 0


# --- records that are not records; losing level 1 ---------------------------------------

def test_a_choices_source_without_choices_is_E_CHOICE_003(sexpgpu, tiny, tmp_path):
    (tmp_path / "other.json").write_text('{"metadata": {"nothing": 1}}')
    (tmp_path / "broken.json").write_text("{")
    for source in ("other.json", "broken.json"):
        code, _, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", "--choices", tmp_path / source,
                               device=FakeDevice())
        assert code == 2 and "error E-CHOICE-003" in err


@pytest.mark.parametrize("how", ["flag", "variable"])
@pytest.mark.parametrize("device", [FakeDevice(), None], ids=["device", "interpreter"])
def test_a_choices_path_that_does_not_exist_is_E_CHOICE_004_naming_it(sexpgpu, tiny, tmp_path, monkeypatch, how, device):
    missing = tmp_path / "runs/a/step-10"
    flags = ["--choices", missing] if how == "flag" else []
    if how == "variable":
        monkeypatch.setenv("SEXPGPU_CHOICES", str(missing))
    code, _, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", *flags, device=device)
    assert code == 2 and f"error E-CHOICE-004: --choices names {missing}, which does not exist." in err
    assert "JSON" not in err and not (tmp_path / "r/metrics.jsonl").exists()


def test_unset_home_runs_and_says_so(sexpgpu, tiny, tmp_path, monkeypatch):
    """determinism.md, "A run loses level 1": with no cache nothing measured is remembered, so
    the level line claims no cache, only this run's own bits."""
    monkeypatch.delenv("HOME")
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice())
    assert code == 0 and "HOME is unset" in line(out, "choosing")
    assert line(out, "determinism").startswith(
        "1 within this run only: HOME is unset, so there is no ~/.cache/sexpgpu, so what it measured is not "
        "remembered and another run on this machine may measure and choose otherwise (3 against this one)")


def unwritable_cache(home: Path) -> Path:
    """A cache no process can write, root included: its lock is a directory."""
    (home / ".cache/sexpgpu/.lock").mkdir(parents=True, exist_ok=True)
    return home / ".cache/sexpgpu"


def test_a_cache_that_cannot_be_written_loses_level_1_and_says_so(sexpgpu, tiny, tmp_path, home):
    cache = unwritable_cache(home)
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice())
    level = line(out, "determinism")
    assert code == 0 and level.startswith(f"1 within this run only: the cache {cache}/")
    assert "cannot be written, so what it measured is not remembered" in level and "~/.cache/sexpgpu;" not in level
    # a resume that chooses again cannot promise this machine repeats it either
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "r2", "--resume", tmp_path / "r/step-3",
                           "--choices", "fresh", device=FakeDevice())
    assert code == 0 and line(out, "determinism").startswith("3: this resume chose again (--choices fresh)")
    assert line(out, "determinism").endswith("another resume here may choose otherwise")


def test_a_cache_that_cannot_be_written_but_holds_every_choice_keeps_level_1(sexpgpu, tiny, tmp_path, home):
    code, _, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "a", device=FakeDevice(product_seconds=SPLIT))
    assert code == 0
    (home / ".cache/sexpgpu/.lock").unlink()
    unwritable_cache(home)
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "b", device=FakeDevice(product_seconds=SPLIT))
    assert code == 0 and "chosen now" not in out
    assert line(out, "determinism").startswith("1: this machine repeats these bits with this binary and ~/.cache/sexpgpu")


def test_a_damaged_cache_is_ignored_and_said(sexpgpu, tiny, tmp_path, home):
    (home / ".cache/sexpgpu").mkdir(parents=True)
    (home / ".cache/sexpgpu/choices.json").write_text("{damaged")
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice())
    assert code == 0 and "could not be read (JSONDecodeError) and is ignored" in out


def test_the_report_names_the_degrees_offered_and_the_free_memory(sexpgpu, tmp_path, tiny):
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice(free_bytes=3 * GIB))
    assert code == 0 and "stacking degrees 1 fit 3.0 GiB free" in out


def test_a_pin_on_s3(sexpgpu, tiny, tmp_path, s3):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "theirs", "--checkpoint-to", s3.uri("theirs"),
            device=FakeDevice(product_seconds=SPLIT))
    mine = FakeDevice(product_seconds=SPLIT)
    code, out, err = sexpgpu("run", tiny, "--run-dir", tmp_path / "mine", "--choices", s3.uri("theirs/step-3"),
                             device=mine)
    assert code == 0, err
    assert line(out, "determinism").startswith("2: pinned") and mine.measured == []


def test_choices_fresh_on_a_new_run_is_its_own_choices(sexpgpu, tiny, tmp_path):
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", "--choices", "fresh", device=FakeDevice())
    assert code == 0 and line(out, "determinism").startswith("1: this machine repeats these bits")


def test_run_help_names_the_choice_flags(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "--choices RECORD|fresh" in text and "--deterministic" in text and "SEXPGPU_CHOICES" in text


def test_every_choice_code_is_documented_and_no_other():
    root = Path(__file__).resolve().parents[2]
    code = re.compile(r"E-CHOICE-\d{3}")
    section = (root / "docs/errors.md").read_text().split("## Choices\n", 1)[1].split("\n## ", 1)[0]
    documented = {code.match(row[2:]).group(0) for row in section.splitlines() if row.startswith("| E-")}
    sources = [root / "src/sexpgpu/run/choosing.py", *(root / "src/sexpgpu/plan").glob("*.py")]
    assert documented == {found for path in sources for found in code.findall(path.read_text())}


def test_a_pinned_record_is_read_for_the_backend_to_take(tmp_path):
    record = choosing.read_pinned(str(_write(tmp_path / "e.json", {"choices": {"device": "d", "stacking": 1,
                                                                                "recompute": 9.21}})))
    assert record.recompute == 9.21
    Interpreter().take_choices(record)  # a backend that decides nothing takes nothing


def _write(path: Path, content: dict) -> Path:
    path.write_text(json.dumps(content))
    return path


def test_the_report_says_which_patterns_are_on_and_the_device_records_them(sexpgpu, tiny, tmp_path):
    from dataclasses import replace

    from sexpgpu.backends.cuda.patterns import PATTERN_NAMES, decide_patterns

    old = "cuDNN 8907 is older than 90000, the first with its graph"
    decided = decide_patterns(None, dict(dict.fromkeys(PATTERN_NAMES), products=old))
    device = FakeDevice(facts=replace(H200, patterns=decided.on), patterns=decided)
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=device)
    assert code == 0
    assert line(out, "patterns") == ("fused attention on: none in these graphs; products with their epilogues off: "
                                     f"{old}; convolutions with their epilogues on: none in these graphs")
    assert choices_of(tmp_path / "r/experiment.json")["device"].endswith("Triton 3.6.0, patterns attention+convolutions")
    assert choices_of(tmp_path / "r/step-3/experiment.json")["device"] == choices_of(tmp_path / "r/experiment.json")["device"]
    code, out, _ = sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "cpu")
    assert code == 0 and "  patterns" not in out  # the interpreter runs no pattern graph


def test_a_backend_without_a_probe_keeps_its_own_choices_line(sexpgpu, tiny, tmp_path, monkeypatch):
    """A device backend that measures nothing yet (the CUDA backend before its probe) states
    its fixed choices and device facts itself, at level 1 on its own machine."""
    facts = dict(cpu_facts(), kind="cuda", name="cuda test", choices="stacking 1, recompute 9.00 flops a byte; on compute_80")

    class Unprobed(Interpreter):
        takes_choices = True  # as the CUDA backend on host tensors, which has no probe

    monkeypatch.setattr(setup, "select_backend", lambda device, gpu=None: (Unprobed(), facts))
    code, out, _ = sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=None)
    assert code == 0 and line(out, "choices") == facts["choices"]
    assert line(out, "determinism").startswith("1: this machine repeats these bits")
    assert choices_of(tmp_path / "r/experiment.json")["recompute"] == 9.0
