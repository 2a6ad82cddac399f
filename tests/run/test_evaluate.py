"""`sexpgpu evaluate` end to end through `main()` (determinism.md, "Offline evaluation"): the
run's passes from its checkpoints, their values against the ones the run logged inline, the
level each way of coming by choices states, and the annotation kept beside the checkpoint.
The CPU interpreter computes; tests/fake_device.py's device stands in for a GPU's choices."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from sexpgpu.lang.forms import load_experiment
from sexpgpu.plan.levels import determinism_line
from sexpgpu.run import choosing
from sexpgpu.run.choosing import ChoiceSettings
from sexpgpu.tools.evaluating import evaluation_choices
from sexpgpu.run.setup import build_run

from fake_device import H200, FakeDevice
from test_choosing import SPLIT, home, line, sexpgpu, tiny  # noqa: F401  (fixtures)
from test_cli import metrics


def inline_evaluations(run_dir: Path) -> dict:
    return {record["step"]: record for record in metrics(run_dir) if "digest" not in record}


def printed_values(out: str) -> list:
    return [json.loads(text) for text in out.splitlines() if text.startswith("{")]


def evaluations(run_dir: Path, step: int) -> list:
    return json.loads((run_dir / "evaluations" / f"step-{step}.json").read_text())["evaluations"]


def tree_digest(folder: Path) -> dict:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture
def cpu_run(sexpgpu, tiny, tmp_path) -> Path:
    code, _, err = sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "r")
    assert code == 0, err
    return tmp_path / "r"


def test_the_interpreter_repeats_the_inline_eval_bits_and_records_the_annotation(sexpgpu, cpu_run):
    before = {step: tree_digest(cpu_run / f"step-{step}") for step in (3, 6)}
    code, out, err = sexpgpu("evaluate", cpu_run, "--device", "cpu")
    assert code == 0, err
    assert printed_values(out) == [inline_evaluations(cpu_run)[3], inline_evaluations(cpu_run)[6]]
    assert line(out, "determinism").startswith("1 on every machine")
    annotation = "evaluated offline on cpu interpreter"
    assert sum(text.startswith(annotation) and ": determinism 1 (recorded in" in text
               for text in out.splitlines()) == 2
    entry, = evaluations(cpu_run, 6)
    assert entry["annotation"].startswith(annotation) and entry["annotation"].endswith(": determinism 1")
    assert entry["values"] == [inline_evaluations(cpu_run)[6]]
    # the checkpoints are as the run wrote them, and verify
    assert {step: tree_digest(cpu_run / f"step-{step}") for step in (3, 6)} == before
    assert sexpgpu("checkpoint", cpu_run / "step-6", "--verify")[0] == 0
    # a second evaluation is added, not written over the first
    assert sexpgpu("evaluate", cpu_run / "step-6", "--device", "cpu", "--pass", "eval")[0] == 0
    assert [entry["values"] for entry in evaluations(cpu_run, 6)] == [[inline_evaluations(cpu_run)[6]]] * 2


def test_on_the_device_the_choices_were_made_on_it_takes_them_at_level_2(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice(product_seconds=SPLIT))
    same = FakeDevice(product_seconds={"ordinary": 0.1, "split-k 2": 1.0})
    code, out, err = sexpgpu("evaluate", tmp_path / "r/step-6", device=same)
    assert code == 0, err
    assert line(out, "determinism").startswith(f"2: pinned to the choices of the checkpoint {tmp_path / 'r/step-6'}")
    assert same.measured == []
    assert printed_values(out) == [inline_evaluations(tmp_path / "r")[6]]
    entry, = evaluations(tmp_path / "r", 6)
    assert entry["annotation"].endswith(": determinism 2") and "compute_80 with 108" in entry["annotation"]
    assert set(entry["choices"]["products"].values()) == {"split-k 2"} and entry["choices"]["stacking"] == 1


def test_on_another_kind_of_device_it_chooses_its_own_at_level_3(sexpgpu, tiny, tmp_path, home):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice(product_seconds=SPLIT))
    other = FakeDevice(facts=H200, product_seconds={"ordinary": 0.1, "split-k 2": 1.0})
    code, out, err = sexpgpu("evaluate", tmp_path / "r/step-3", device=other)
    assert code == 0, err
    level = line(out, "determinism")
    assert level.startswith("3: the checkpoint's choices were made on compute_80") and "compute_90" in level
    assert ("throughput",) in other.measured and (home / ".cache/sexpgpu").is_dir()
    assert set(evaluations(tmp_path / "r", 3)[0]["choices"]["products"].values()) == {"ordinary"}


def test_choices_fresh_chooses_at_level_3_and_deterministic_at_level_2(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice(product_seconds=SPLIT))
    code, out, _ = sexpgpu("evaluate", tmp_path / "r/step-3", "--choices", "fresh", device=FakeDevice(product_seconds=SPLIT))
    assert code == 0 and line(out, "determinism").startswith("3: --choices fresh")
    device = FakeDevice(product_seconds=SPLIT)
    code, out, _ = sexpgpu("evaluate", tmp_path / "r/step-3", "--deterministic", device=device)
    assert code == 0 and line(out, "determinism").startswith("2: --deterministic") and device.measured == []
    code, _, err = sexpgpu("evaluate", tmp_path / "r/step-3", "--deterministic", "--choices", tmp_path / "r/step-3")
    assert code == 2 and "error E-CHOICE-002" in err


def test_pinned_to_another_record_it_takes_that_one(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "theirs", device=FakeDevice(facts=H200, product_seconds=SPLIT))
    sexpgpu("run", tiny, "--run-dir", tmp_path / "mine", "--device", "cpu")
    device = FakeDevice(facts=H200, product_seconds=SPLIT)
    code, out, err = sexpgpu("evaluate", tmp_path / "mine/step-3", "--choices", tmp_path / "theirs/experiment.json",
                             device=device)
    assert code == 0, err
    assert line(out, "determinism").startswith(f"2: pinned to the choices of {tmp_path / 'theirs/experiment.json'}")
    assert device.measured == []


def test_a_pinned_product_with_no_recorded_implementation_is_E_CHOICE_001(sexpgpu, tiny, tmp_path):
    sexpgpu("run", tiny, "--run-dir", tmp_path / "r", device=FakeDevice(product_seconds=SPLIT))
    record = json.loads((tmp_path / "r/experiment.json").read_text())
    record["choices"]["products"] = {}  # recorded, and without the passes' shapes
    (tmp_path / "pin.json").write_text(json.dumps(record))
    code, out, err = sexpgpu("evaluate", tmp_path / "r/step-3", "--choices", tmp_path / "pin.json",
                             device=FakeDevice(product_seconds=SPLIT))
    assert code == 2 and "error E-CHOICE-001" in err and "has no recorded implementation" in err
    assert not (tmp_path / "r/evaluations").exists()
    code, out, _ = sexpgpu("evaluate", tmp_path / "r/step-3", "--choices", "fresh", device=FakeDevice(product_seconds=SPLIT))
    assert code == 0 and line(out, "determinism").startswith("3:")


def test_the_interpreter_evaluating_a_cuda_checkpoint_is_level_3(tiny):
    built = build_run(load_experiment(tiny), "cpu", read_loads=False)
    recorded = {"device": "cuda", "choices": {"device": "compute_90 with 132 multiprocessors", "stacking": 2}}
    chosen = evaluation_choices(built, ChoiceSettings(), recorded, "s3://b/r/step-3")
    level = determinism_line(chosen.how, chosen.choices.device)
    assert level.startswith("3: the checkpoint's choices were made on compute_90 with 132 multiprocessors")
    assert chosen.choices.stacking == 1
    cpu = evaluation_choices(built, ChoiceSettings(), {"device": "cpu", "choices": None}, "r/step-3")
    assert determinism_line(cpu.how, cpu.choices.device).startswith("1 on every machine")


def test_a_pass_product_training_did_not_record_takes_ordinary_as_inline(tiny, monkeypatch):
    built = build_run(load_experiment(tiny), "cpu", read_loads=False)
    device = FakeDevice(product_seconds=SPLIT)
    monkeypatch.setattr(choosing, "backend_probe", lambda backend: device)
    recorded = {"device": device.facts.line(), "stacking": 1, "recompute": 9.0, "products": {}}
    chosen = evaluation_choices(built, ChoiceSettings(), {"device": "cuda", "choices": recorded}, "r/step-3")
    assert determinism_line(chosen.how, chosen.choices.device).startswith("2: pinned to the choices of the checkpoint")
    assert chosen.choices.products and set(chosen.choices.products.values()) == {"ordinary"}
    assert device.measured == []


def test_from_s3(sexpgpu, tiny, tmp_path, s3):
    sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "r", "--checkpoint-to", s3.uri("r"))
    code, out, err = sexpgpu("evaluate", s3.uri("r/step-6"), "--device", "cpu")
    assert code == 0, err
    assert printed_values(out) == [inline_evaluations(tmp_path / "r")[6]]
    assert f"(recorded in {s3.uri('r/evaluations/step-6.json')})" in out
    assert sexpgpu("evaluate", s3.uri("r"), "--device", "cpu")[0] == 0  # the root: every checkpoint
    assert "evaluations" not in [name for name in s3.keys("r/step-6/")]


def test_bad_input(sexpgpu, cpu_run, tiny, tmp_path):
    def refused(*args):
        code, _, err = sexpgpu("evaluate", *args, "--device", "cpu")
        assert code == 2 and "Traceback" not in err, err
        return err

    assert "E-EVAL-004" in refused(cpu_run / "step-3", "--pass", "valid")
    assert "E-CKPT-003" in refused(tmp_path / "nowhere")
    (cpu_run / "evaluations").mkdir()
    (cpu_run / "evaluations/step-3.json").write_text("{not json")
    assert "E-EVAL-005" in refused(cpu_run / "step-3")
    assert "evaluating" not in sexpgpu("evaluate", cpu_run / "step-3", "--device", "cpu")[1]  # before computing
    tiny.write_text(tiny.read_text().replace(":batches 4", ":batches 2"))
    assert "E-EVAL-002" in refused(cpu_run / "step-6") and "its passes changed" in refused(cpu_run / "step-6")
    tiny.write_text(tiny.read_text().replace(":lr 0.01", ":lr 0.02"))
    assert "its model, data, optimizer or schedule changed" in refused(cpu_run / "step-6")
    moved = tmp_path / "moved.sexp"
    tiny.rename(moved)
    assert "E-EVAL-001" in refused(cpu_run / "step-6")
    assert "E-EVAL-002" in refused(cpu_run / "step-6", "--file", moved)


def test_a_run_without_passes_is_E_EVAL_003(sexpgpu, tiny, tmp_path):
    tiny.write_text(tiny.read_text().replace("  :passes ((eval :every 3 :batches 4))\n", ""))
    assert sexpgpu("run", tiny, "--device", "cpu", "--run-dir", tmp_path / "r")[0] == 0
    code, _, err = sexpgpu("evaluate", tmp_path / "r/step-3", "--device", "cpu")
    assert code == 2 and "E-EVAL-003" in err


def test_every_evaluation_and_tools_code_is_documented_and_triggered():
    root = Path(__file__).resolve().parents[2]
    code = re.compile(r"E-(?:EVAL|DIFF)-\d{3}")
    section = (root / "docs/errors.md").read_text().split("## Evaluation and tools\n", 1)[1].split("\n## ", 1)[0]
    documented = {code.match(row[2:]).group(0) for row in section.splitlines() if row.startswith("| E-")}
    raised = {found for path in (root / "src/sexpgpu").rglob("*.py") for found in code.findall(path.read_text())}
    assert raised == documented
    tests = "".join(path.read_text() for path in (root / "tests/run").glob("test_*.py"))
    assert all(f'"{found}"' in tests for found in documented)
