"""bench/harness.py: each benchmark row in a process of its own, with the environment it asks
for and none of the parent's flags; a row that fails is reported, not raised; the results
are written with the machine, the versions and the date. And bench/bench_cuda.py's peers: a
peer row runs with PyTorch's defaults, the deterministic one with cuBLAS's fixed workspace."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_cuda  # noqa: E402
import harness  # noqa: E402

# a benchmark whose rows say which process and environment they ran in, or fail as told
ROWS_SCRIPT = f"""
import os, sys, time
sys.path.insert(0, {str(ROOT / "bench")!r})
import harness

def time_row(spec):
    if spec.get("raise"):
        raise ValueError("this row cannot run\\nsecond line")
    if spec.get("crash"):
        os._exit(3)
    time.sleep(spec.get("sleep", 0))
    return {{"pid": os.getpid(), "setting": os.environ.get("BENCH_TEST_SETTING")}}

harness.answer(time_row, sys.argv[sys.argv.index("--row") + 1])
"""


def test_each_row_runs_in_a_process_of_its_own_and_a_failing_row_is_reported_not_raised(tmp_path, monkeypatch,
                                                                                         capsys):
    script = tmp_path / "rows.py"
    script.write_text(ROWS_SCRIPT)
    monkeypatch.setenv("BENCH_TEST_SETTING", "the parent's")
    rows = [harness.Row("given", {}, {"BENCH_TEST_SETTING": "the row's"}),
            harness.Row("removed", {}, {"BENCH_TEST_SETTING": None}), harness.Row("inherited", {}),
            harness.Row("raises", {"raise": True}), harness.Row("crashes", {"crash": True})]
    found = {result.name: result for result in harness.run_rows(script, rows, timeout=60)}
    ran = [found[name].found for name in ("given", "removed", "inherited")]
    assert [each["setting"] for each in ran] == ["the row's", None, "the parent's"]
    assert len({each["pid"] for each in ran} | {os.getpid()}) == 4
    assert found["raises"].error == "ValueError: this row cannot run" and found["raises"].found == {}
    assert found["crashes"].error.startswith("no record (exit status 3)")
    assert harness.run_row(script, harness.Row("too slow", {"sleep": 30}), timeout=1).error == "ran past 1 s"
    printed = capsys.readouterr().out
    assert "[1/5] given ..." in printed and "[4/5] raises: FAILED: ValueError: this row cannot run (" in printed


def report(rows) -> harness.Report:
    return harness.Report("bench_test-tiny", "bench_test: tiny", rows, ["row", "ms"],
                          [[row.name, "1.00"] for row in rows], ["ours vs peer: peer/ours 1.50"], {"steps": 2})


def test_the_results_name_the_machine_the_versions_and_the_date(tmp_path):
    rows = [harness.RowResult("ours", 1.5, {"seconds": 0.001}), harness.RowResult("peer", 0.5, {}, "RuntimeError: no")]
    path = harness.write_results(report(rows), tmp_path)
    record = json.loads(path.read_text())
    assert path == tmp_path / "bench_test-tiny.json"
    assert set(record["machine"]) >= {"gpu", "cpu", "cores"} and record["machine"]["cores"] == os.cpu_count()
    assert set(record["versions"]) == {"python", "torch", "triton", "numpy", "sexpgpu", "sources"}
    assert record["date"].endswith("+00:00") and record["settings"] == {"steps": 2}
    assert record["rows"][1] == {"name": "peer", "wall_seconds": 0.5, "found": {}, "error": "RuntimeError: no"}
    table = (tmp_path / "bench_test-tiny.md").read_text()
    assert table.startswith("# bench_test: tiny\n") and "- versions: python " in table and "sexpgpu " in table
    assert "| row | ms |\n|---|---|\n| ours | 1.00 |" in table
    assert "- ours vs peer: peer/ours 1.50" in table and "- peer failed: RuntimeError: no" in table
    # a smoke run is there to fail when a script is broken: it writes, then exits with the rows that failed
    with pytest.raises(SystemExit, match="rows failed: peer"):
        harness.write_results(report(rows), tmp_path / "smoke", smoke=True)
    assert (tmp_path / "smoke" / "bench_test-tiny.md").exists()
    assert harness.results_folder(None, smoke=False) == ROOT / "bench" / "results"


def test_a_copy_of_the_tree_without_git_is_named_by_its_caller_and_its_sources(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "src" / "module.py").write_text("x = 1\n")
    monkeypatch.setattr(harness, "ROOT", tmp_path)
    monkeypatch.setenv("BENCH_REVISION", "2d2b3d0 as copied")
    assert harness.git_revision() == "2d2b3d0 as copied"
    before = harness.source_digest()
    (tmp_path / "src" / "module.py").write_text("x = 2\n")
    assert len(before) == 16 and harness.source_digest() != before


def test_the_peers_are_the_issues_and_only_the_deterministic_one_fixes_cublas():
    assert bench_cuda.DEFAULT_ROWS == ("ours", "eager", "compile", "compile-deterministic")
    assert bench_cuda.ROWS == ("ours", "ours-patterns-off", *bench_cuda.DEFAULT_ROWS[1:])
    assert [(peer.compiled, peer.deterministic) for peer in bench_cuda.PEERS.values()] == [
        (False, False), (True, False), (True, True)]
    assert bench_cuda.row_environment("compile-deterministic") == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    for peer in ("eager", "compile"):  # whatever the shell had
        assert bench_cuda.row_environment(peer) == {"CUBLAS_WORKSPACE_CONFIG": None}
    assert bench_cuda.row_environment("ours") == {}  # its device set-up sets its own
    assert bench_cuda.row_environment("ours-patterns-off") == {"SEXPGPU_PATTERNS": "off"}
    # GPT-2 small's shape, which the PyTorch peer takes as it is
    shape = dict(vocab=50304, context=1024, width=768, heads=12, ff=3072, layers=12)
    assert bench_cuda.MODELS["gpt-124m"].options == shape
    assert bench_cuda.MODELS["gpt-124m"].batch == 8


def test_a_peer_row_runs_with_pytorchs_defaults_and_a_bad_invocation_writes_nothing(monkeypatch):
    for name, value in (("PYTHONPATH", str(ROOT / "src")), ("CUDA_VISIBLE_DEVICES", ""),
                        ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")):  # the shell's, which the peer must not inherit
        monkeypatch.setenv(name, value)
    script = ROOT / "bench" / "bench_cuda.py"
    spec = {"model": bench_cuda.SMOKE_MODEL, "precision": "bf16", "row": "eager", "steps": 1, "warmup": 0,
            "smoke": True}
    row = harness.run_row(script, harness.Row("eager", spec, bench_cuda.row_environment("eager")), timeout=120)
    assert row.ok, row.error
    flags = row.found["flags"]
    assert row.found["seconds"] > 0 and flags["CUBLAS_WORKSPACE_CONFIG"] is None
    assert flags["deterministic_algorithms"] is False and flags["bf16_reduced_precision_reduction"] is True
    for argv, said in ((["--smoke", "--rows", "ours-f16"], "unknown rows ours-f16: the rows are ours, ours-patterns-off, eager"),
                       ([], "this benchmark runs on a GPU: no CUDA GPU here")):  # nothing written to bench/results
        done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and said in done.stderr, done.stderr


def test_a_failed_peer_is_a_row_of_the_table_and_the_others_keep_their_ratios(capsys):
    flags = {"deterministic_algorithms": False, "bf16_reduced_precision_reduction": True}
    ours = {"seconds": 0.010, "set_up_and_first_steps": 30.0, "flags": {**flags, "deterministic_algorithms": True},
            "profile": {"matmul": 0.006, "elementwise": 0.002}, "products": "3 ordinary", "tflops": 100.0,
            "facts": {"name": "cuda H200", "choices": "stacking 1"}}
    results = {"ours": harness.RowResult("gpt-124m/bf16/ours", 60.0, ours),
               "eager": harness.RowResult("gpt-124m/bf16/eager", 20.0,
                                          {"seconds": 0.015, "set_up_and_first_steps": 5.0, "flags": flags}),
               "compile": harness.RowResult("gpt-124m/bf16/compile", 3.0, {}, "BackendCompilerFailed: no compiler")}
    written = bench_cuda.report("gpt-124m", "bf16", results, argparse.Namespace(steps=20, warmup=5))
    assert written.name == "bench_cuda-gpt-124m-bf16"
    assert written.table == [["ours", "10.00", "", "", "on", "on", "30.0"],
                             ["eager", "15.00", "1.50", ">= 1.0", "off", "on", "5.0"],
                             ["compile", "failed", "", "", "", "", "BackendCompilerFailed: no compiler"]]
    assert written.lines[0] == "ours vs eager: eager/ours 1.50 (goal >= 1.0: met)"
    assert "ours, one profiled microbatch: matmul 6.00 ms (75%), elementwise 2.00 ms (25%)" in written.lines
    assert "compile                 FAILED: BackendCompilerFailed: no compiler" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["gpt-50m", "gpt-124m"])
def test_each_peer_holds_the_parameters_of_its_experiment(name, capsys):
    import torch

    import torch_models
    from sexpgpu.cli.main import main

    model = bench_cuda.MODELS[name]
    assert main(["check", str(model.path)]) == 0
    counted = re.search(r"parameters +(\d+) tensors, ([\d,]+) values", capsys.readouterr().out)
    with torch.device("meta"):  # the shapes alone
        peer = torch_models.CharLM(**model.options, sdpa=True)
    tensors = list(peer.parameters())
    values = sum(tensor.numel() for tensor in tensors)
    assert (int(counted.group(1)), int(counted.group(2).replace(",", ""))) == (len(tensors), values)
