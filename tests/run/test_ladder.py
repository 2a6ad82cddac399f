"""`sexpgpu ladder` (docs/ladder.md): the quick ladder passes on the CPU within CI's two
minutes; a tiny ladder of one 6-step tier runs every row and writes its report; a learning
rate changed by a tenth fails level 3 and a planted one-ulp change fails level 1; envelopes
are regenerated bit for bit and the committed ones are current; drawn variations on a device
that makes choices (tests/fake_device.py's) take only what it offers; bad input exits 2 with
an E-LADDER code."""

from __future__ import annotations

import io
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from sexpgpu.cli.main import main
from sexpgpu.ladder.envelopes import MARGIN, Envelope, Margin, Source, outside_peers, read_envelope, tier_digest
from sexpgpu.ladder.promises import FAIL, NOT_RUN, PASS, PROMISES, Workspace, same_bits
from sexpgpu.ladder.tiers import REFERENCE, read_tiers, select_tiers
from sexpgpu.ladder.variations import RECOMPUTE_BUDGETS, compute, envelope_variations
from sexpgpu.run.session import RunOptions, execute
from sexpgpu.run.setup import build_run
from sexpgpu.lang.forms import load_experiment

from fake_device import FakeDevice
from test_choosing import SPLIT, home, sexpgpu  # noqa: F401  (fixtures)
from test_diff import plant_one_ulp

ROOT = Path(__file__).resolve().parents[2]
LADDER = Path(REFERENCE)  # the reference ladder, package data
SPIRALS = LADDER / "data" / "spirals.npz"
CI_LIMIT_SECONDS = 120  # what `sexpgpu ladder --quick` may take on CI's two cores (about 30 s)

TINY_TIER = {"name": "tiny", "purpose": "a 6-step tier for tests", "chaotic": False, "devices": ["cpu"],
             "quick": True, "exact_steps": 1}
BIG_TIER = dict(TINY_TIER, name="big", devices=["cuda"], quick=False)


def with_spirals(text: str) -> str:
    """A tier's text that reads the reference ladder's spirals from wherever the text is written."""
    assert '"data/spirals.npz"' in text
    return text.replace('"data/spirals.npz"', f'"{SPIRALS}"')


def tier_text(lr: str = "0.01", microbatches: int = 4) -> str:
    text = with_spirals((LADDER / "tiny-adam.sexp").read_text())
    edits = {":steps 200": ":steps 6", ":checkpoint 100": ":checkpoint 3", ":every 50": ":every 3",
             ":batch 16": ":batch 4", ":microbatches 4": f":microbatches {microbatches}", "(adam :lr 0.01)": f"(adam :lr {lr})",
             "(defrun tiny-adam": "(defrun tiny"}
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.fixture
def tiny_ladder(tmp_path) -> Path:
    """A ladder folder of one 6-step CPU tier, `tiny`, with no envelope yet, and a GPU tier."""
    folder = tmp_path / "ladder"
    folder.mkdir()
    (folder / "tiers.json").write_text(json.dumps({"format": 1, "tiers": [TINY_TIER, BIG_TIER]}))
    (folder / "tiny.sexp").write_text(tier_text())
    return folder


def climb(sexpgpu, *args) -> tuple:
    return sexpgpu("ladder", *args)


# --- the quick ladder and a tiny one ------------------------------------------------------

@pytest.mark.slow
def test_the_quick_ladder_passes_on_the_cpu_within_two_minutes(sexpgpu, tmp_path):
    started, cpu = time.perf_counter(), time.process_time()
    code, out, err = climb(sexpgpu, "--quick", "--device", "cpu", "--run-dir", tmp_path / "quick")
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"\nsexpgpu ladder --quick --device cpu: {seconds:.0f} s, {cpu:.0f} s of CPU time")
    assert code == 0, out + err
    report = json.loads((tmp_path / "quick" / "report.json").read_text())
    assert [tier["name"] for tier in report["tiers"]] == ["tiny-adam", "spirals-chaotic"] and not report["failed"]
    for tier in report["tiers"]:
        rows = {row["row"]: row for row in tier["rows"]}
        assert {row: found["verdict"] for row, found in rows.items()} == \
            dict({promise.row: PASS for promise in PROMISES}, **{"exact: CPU = GPU": NOT_RUN})
        assert "no GPU" in rows["exact: CPU = GPU"]["measured"]
        assert rows["exact: stacking"]["measured"].startswith("stacking 1, 2, 4: identical")
        assert rows["level 3"]["measured"].startswith("inside at all")
        assert (tmp_path / "quick" / f"{tier['name']}.png").stat().st_size > 10_000
    markdown = (tmp_path / "quick" / "report.md").read_text()
    assert re.search(r"`sexpgpu ladder --quick --device cpu` on cpu interpreter .*: 14 pass, 2 not run in \d+ s "
                     r"\(\d+ s of CPU time\)", markdown)
    assert "| level 3 | " in markdown and "![spirals-chaotic: " in markdown
    assert cpu < CI_LIMIT_SECONDS  # the CPU time: on CI's idle cores the wall time, here robust to a busy machine


def test_a_learning_rate_changed_by_a_tenth_fails_level_3(tmp_path):
    (tier,) = select_tiers(read_tiers(str(LADDER)), ["tiny-adam"], "cpu", False)
    changed = tmp_path / "tiny-adam.sexp"
    text = with_spirals((LADDER / "tiny-adam.sexp").read_text())
    changed.write_text(text.replace("(adam :lr 0.01)", "(adam :lr 0.011)"))
    execute(load_experiment(changed), RunOptions(run_dir=str(tmp_path / "run"), device="cpu", out=io.StringIO(),
                                                 err=io.StringIO()))
    workspace = Workspace(tier, tier.experiment(), "cpu", str(tmp_path), read_envelope(tier))
    workspace.made = {"a": str(tmp_path / "run"), "rechosen": str(tmp_path / "run")}
    outcome = next(promise for promise in PROMISES if promise.row == "level 3").check(workspace)
    assert outcome.verdict == FAIL and "first at step 2" in outcome.measured, outcome


def test_a_one_ulp_change_fails_level_1(tiny_ladder, tmp_path):
    (tier,) = select_tiers(read_tiers(str(tiny_ladder)), ["tiny"], "cpu", False)
    experiment = tier.experiment()
    quiet = {"device": "cpu", "out": io.StringIO(), "err": io.StringIO()}
    execute(experiment, RunOptions(run_dir=str(tmp_path / "a"), **quiet))
    plant_one_ulp(tmp_path / "a", tmp_path / "b", 3)
    execute(experiment, RunOptions(run_dir=str(tmp_path / "b"), resume="latest", **quiet))
    workspace = Workspace(tier, experiment, "cpu", str(tmp_path), None)
    workspace.made = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    outcome = PROMISES[0].check(workspace)
    assert PROMISES[0].row == "level 1" and outcome.verdict == FAIL
    assert "step 4's digest" in outcome.measured and "1 tensor of step-3 (" in outcome.measured, outcome
    assert same_bits(str(tmp_path / "a"), str(tmp_path / "a")).verdict == PASS


def test_the_exact_cpu_gpu_row_is_not_run_where_the_gpu_refuses_and_fails_on_one_bit(tiny_ladder):
    (tier,) = select_tiers(read_tiers(str(tiny_ladder)), ["tiny"], "cpu", False)
    experiment = tier.experiment()
    row = next(promise for promise in PROMISES if promise.row == "exact: CPU = GPU")
    workspace = Workspace(tier, experiment, "cuda", "unused", None)
    workspace.computed = {"cuda": "error E-EXACT-003: the CUDA backend does not compute :arithmetic exact yet."}
    outcome = row.check(workspace)
    assert outcome.verdict == NOT_RUN and "E-EXACT-003" in outcome.measured and "cpu" not in workspace.computed
    computed = compute(experiment, "cpu", envelope_variations("tiny", build_run(experiment, "cpu"))[0], 2)
    workspace.computed = {"cuda": {1: computed}, "cpu": {1: computed}}
    assert row.check(workspace).measured == ("stacking 1 on the CPU and on the GPU: identical 2 steps' loss bits, "
                                             "gradient norms and digests and the final 18 tensors")
    planted = dict(computed.state)
    planted["fc1/w"] = planted["fc1/w"].copy()
    planted["fc1/w"].flat[0] = np.nextafter(planted["fc1/w"].flat[0], np.float32(np.inf))
    workspace.computed["cuda"] = {1: type(computed)(computed.records, planted)}
    assert row.check(workspace).verdict == FAIL


# --- envelopes ----------------------------------------------------------------------------

def synthetic(curves, margin: Margin = MARGIN) -> Envelope:
    sources = tuple(Source("synthetic", "cpu", f"curve {index}", [], "test", list(curve)) for index, curve in enumerate(curves))
    return Envelope("synthetic", "digest", len(curves[0]), margin, sources)


def test_the_band_is_the_range_widened_by_the_spread_nearby_and_a_relative_floor():
    curves = np.array([[1.0, 1.0, 1.0, 0.5], [1.0, 1.0, 1.2, 0.5], [1.0, 1.0, 1.1, 0.5]])
    envelope = synthetic(curves, Margin(spread=1.0, window=1, relative=0.01))
    low, high, least, most = envelope.band()
    assert most.tolist() == [1.0, 1.0, 1.2, 0.5] and least.tolist() == [1.0, 1.0, 1.0, 0.5]
    # step 2 and step 4 are within one step of step 3, whose range is 0.2
    assert np.allclose(high - most, [0.01, 0.2 + 0.01, 0.2 + 0.012, 0.2 + 0.005])
    assert np.allclose(least - low, high - most)


def test_a_curve_is_inside_or_outside_at_each_step():
    envelope = synthetic(np.array([[2.0, 1.0, 0.5]] * 4 + [[2.0, 1.01, 0.5]]), Margin(spread=1.0, window=0, relative=0.0))
    assert envelope.check([2.0, 1.005, 0.5]).inside
    assert envelope.check([2.0, 1.01, 0.5]).describe() == "inside at all 3 steps, within the sources' own range at each"
    assert envelope.check([2.0, 1.019, 0.5]).inside and envelope.check([2.0, 1.019, 0.5]).furthest == pytest.approx(0.9)
    assert envelope.check([2.0, 1.021, 0.5]).outside == [2]
    assert envelope.check([2.0, 1.0, float("nan")]).outside == [3]  # a diverged run is outside everything
    assert envelope.check([2.0, 1.0]).describe() == "outside: the curve has 2 steps and the envelope 3"
    assert "outside at 1 of 3 steps, first at step 2" == envelope.check([2.0, 0.9, 0.5]).describe()


def test_envelopes_are_regenerated_bit_for_bit_and_keep_other_devices_sources(sexpgpu, tiny_ladder):
    assert climb(sexpgpu, "--envelopes", "tiny", "--device", "cpu", "--ladder", tiny_ladder)[0] == 0
    path = tiny_ladder / "envelopes" / "tiny.json"
    first = path.read_text()
    content = json.loads(first)
    assert [source["variation"] for source in content["sources"]] == [
        "stacking 1", "stacking 2", "stacking 4", "stacking 1, then 2 from step 4", "stacking 2, then 4 from step 4",
        "stacking 4, then 1 from step 4"]
    assert content["sources"][3]["segments"][1]["from"] == 4 and content["sources"][3]["segments"][1]["choices"]["stacking"] == 2
    gpu = dict(content["sources"][0], device="compute_90 with 132 multiprocessors", kind="cuda")
    content["sources"].append(gpu)
    path.write_text(json.dumps(dict(content, band=synthetic([s["loss"] for s in content["sources"]]).to_json()["band"])))
    assert climb(sexpgpu, "--envelopes", "tiny", "--device", "cpu", "--ladder", tiny_ladder)[0] == 0
    again = json.loads(path.read_text())
    assert again["sources"][0] == gpu and again["sources"][1:] == json.loads(first)["sources"]


def test_the_committed_envelopes_are_current_and_each_source_is_inside_the_others():
    for tier in read_tiers(str(LADDER)):
        if "cpu" not in tier.devices:  # a GPU tier's envelope is measured on a GPU (docs/ladder.md)
            continue
        built = build_run(tier.experiment(), "cpu", read_loads=False)
        envelope = read_envelope(tier, tier_digest(built))  # E-LADDER-004 when stale or its band is not its sources'
        assert len(envelope.sources) >= 6 and {source.kind for source in envelope.sources} >= {"cpu"}
        assert outside_peers(envelope) == [], tier.name


@pytest.mark.slow
def test_the_cpu_regenerates_the_committed_chaotic_envelope_bit_for_bit(sexpgpu, tmp_path):
    copy = tmp_path / "ladder"
    shutil.copytree(LADDER, copy)
    committed = (LADDER / "envelopes" / "spirals-chaotic.json").read_text()
    code, out, err = climb(sexpgpu, "--envelopes", "spirals-chaotic", "--device", "cpu", "--ladder", copy)
    assert code == 0, err
    cpu = [source for source in json.loads(committed)["sources"] if source["kind"] == "cpu"]
    regenerated = json.loads((copy / "envelopes" / "spirals-chaotic.json").read_text())
    assert [source for source in regenerated["sources"] if source["kind"] == "cpu"] == cpu


# --- variations on a device that makes choices ---------------------------------------------

def test_drawn_variations_take_only_what_the_device_offers(tiny_ladder, monkeypatch):
    device = FakeDevice(product_seconds=SPLIT)
    from sexpgpu.run import choosing

    monkeypatch.setattr(choosing, "backend_probe", lambda backend: device)
    experiment = load_experiment(tiny_ladder / "tiny.sexp")
    variations = envelope_variations("tiny", build_run(experiment, "cpu"))
    names = [variation.name for variation in variations]
    assert names[:6] == ["stacking 1", "stacking 2", "stacking 4", "stacking 1, then 2 from step 4",
                         "stacking 2, then 4 from step 4", "stacking 4, then 1 from step 4"]
    assert len(names) == 10 and all(name.startswith(f"seed {seed}: ") for seed, name in zip(range(1, 5), names[6:]))
    assert [variation.name for variation in envelope_variations("tiny", build_run(experiment, "cpu"))] == names
    drawn = compute(experiment, "cpu", variations[6])
    again = compute(experiment, "cpu", variations[6])
    assert drawn.segments == again.segments and drawn.records == again.records
    implementations = set()
    for segment in drawn.segments + compute(experiment, "cpu", variations[0]).segments:
        choices = segment["choices"]
        assert choices["recompute"] in RECOMPUTE_BUDGETS and choices["device"] == device.facts.line()
        assert choices["products"] and set(choices["products"].values()) <= set(SPLIT)
        implementations |= set(choices["products"].values())
    assert "ordinary" in implementations
    fixed = compute(experiment, "cpu", variations[0]).segments[0]["choices"]
    assert set(fixed["products"].values()) == {"ordinary"} and fixed["recompute"] == RECOMPUTE_BUDGETS[0]


# --- bad input ----------------------------------------------------------------------------

def test_bad_input_exits_2_with_a_code(sexpgpu, tiny_ladder, tmp_path):
    def refused(*args) -> str:
        code, _, err = climb(sexpgpu, *args)
        assert code == 2 and "Traceback" not in err, err
        return err

    assert "E-LADDER-002" in refused("tin", "--device", "cpu", "--ladder", tiny_ladder) and "Did you mean 'tiny'?" in \
        refused("tin", "--device", "cpu", "--ladder", tiny_ladder)
    assert "E-LADDER-003" in refused("big", "--device", "cpu", "--ladder", tiny_ladder)
    assert "E-LADDER-001" in refused("--device", "cpu", "--ladder", tmp_path / "nowhere")
    (tmp_path / "broken").mkdir()
    for manifest in ("{", '{"format": 2, "tiers": []}', json.dumps({"format": 1, "tiers": [dict(TINY_TIER, devices=["tpu"])]}),
                     json.dumps({"format": 1, "tiers": [dict(TINY_TIER, color="red")]})):
        (tmp_path / "broken" / "tiers.json").write_text(manifest)
        assert "E-LADDER-001" in refused("--device", "cpu", "--ladder", tmp_path / "broken")
    assert "E-LADDER-004" in refused("--device", "cpu", "--ladder", tiny_ladder, "--run-dir", tmp_path / "r1")
    assert not (tmp_path / "r1").exists()  # refused before anything is written
    assert climb(sexpgpu, "--envelopes", "--device", "cpu", "--ladder", tiny_ladder)[0] == 0
    (tiny_ladder / "tiny.sexp").write_text(tier_text(lr="0.02"))
    assert "another version of" in refused("--device", "cpu", "--ladder", tiny_ladder)
    (tiny_ladder / "tiny.sexp").write_text(tier_text())
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    assert "E-LADDER-005" in refused("--device", "cpu", "--ladder", tiny_ladder, "--run-dir", tmp_path / "full")
    (tiny_ladder / "tiny.sexp").write_text(tier_text(microbatches=1).replace(":batch 4", ":batch 16"))
    assert "E-LADDER-006" in refused("--envelopes", "--device", "cpu", "--ladder", tiny_ladder)


def test_the_ladder_has_help_and_every_code_is_documented_raised_and_tested(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["ladder", "--help"])
    assert exited.value.code == 0 and "--envelopes" in capsys.readouterr().out
    code = re.compile(r"E-LADDER-\d{3}")
    section = (ROOT / "docs/errors.md").read_text().split("## The ladder\n", 1)[1].split("\n## ", 1)[0]
    documented = {code.match(row[2:]).group(0) for row in section.splitlines() if row.startswith("| E-")}
    raised = {found for path in (ROOT / "src/sexpgpu").rglob("*.py") for found in code.findall(path.read_text())}
    assert raised == documented
    tests = Path(__file__).read_text()
    assert all(f'"{found}"' in tests for found in documented)


def test_docs_ladder_md_lists_the_tiers_of_tiers_json_and_links_its_reports():
    section = (ROOT / "docs/ladder.md").read_text().split("## Tiers\n", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in section.splitlines() if line.startswith("| `")]
    documented = [(row[0].strip("`"), row[3], row[4]) for row in rows]
    assert documented == [(tier.name, ", ".join(tier.devices), "yes" if tier.quick else "no")
                          for tier in read_tiers(str(LADDER))]
    reports = re.findall(r"\]\((\.\./bench/results/ladder/[^)]+/report\.md)\)", (ROOT / "docs/ladder.md").read_text())
    assert len(reports) >= 2  # tests/docs checks that each is there, with its plots
