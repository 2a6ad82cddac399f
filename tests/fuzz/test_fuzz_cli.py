"""The fuzzer: mutated examples and malformed files through `sexpgpu check` (and for every 50th
case `sexpgpu run` for two steps), in-process in a worker, each with a time limit; and two
more kinds of case, each checked and run for two steps: malformed record files
(fuzz_records.py) and environment values (fuzz_environment.py).

Every case must exit 0, or exit 2 with a code and, for an error about the file's text, its
line and column; no exit 3, no traceback, no raw control character in a message, no hang.
SEXPGPU_FUZZ_CASES sets the number of file cases (CI: 5,000, split into shards that
pytest-xdist spreads over the cores), SEXPGPU_FUZZ_RECORD_CASES the record cases (CI: 400);
the environment cases are every (variable, value class) pair once. tests/fuzz/fuzz_cli.py runs
many more by hand and groups the failures. The figures are printed at the end of the pytest run.
"""

from __future__ import annotations

import os
import time

import pytest

from fuzz_environment import VALUE_CLASSES, pairs, variables
from fuzz_harness import FAILURE_LABELS, KINDS, Outcome, S3Target, classify, fuzz, judge_run
from fuzz_mutators import MUTATORS, RUN_MUTATORS, Plan, load_seeds, make_case, shrink_for_run
from fuzz_records import RECORD_FILE, RECORD_MAKERS
from s3server import s3_server  # noqa: F401

from sexpgpu import settings

CASES = int(os.environ.get("SEXPGPU_FUZZ_CASES", "5000"))
SHARDS = 8
RECORD_CASES = int(os.environ.get("SEXPGPU_FUZZ_RECORD_CASES", "400"))
ENVIRONMENT_CASES = len(pairs())
KIND_SHARDS = 4


def test_a_case_is_a_function_of_its_index():
    seeds, runnable = load_seeds()
    first = [make_case(i, seeds, runnable) for i in range(200)]
    again = [make_case(i, seeds, runnable) for i in range(200)]
    assert first == again
    assert len({case.text for case in first}) > 190, "cases should differ from each other"


def test_the_cases_cover_every_mutation_and_both_commands():
    seeds, runnable = load_seeds()
    cases = [make_case(i, seeds, runnable) for i in range(2000)]
    used = {name for case in cases for name in case.mutations}
    assert used == {m.name for m in MUTATORS} | {m.name for m in RUN_MUTATORS}
    assert {case.command for case in cases} == {"check", "run"}
    drawn = {case.seed for case in cases}
    assert {seed.name for seed in seeds if seed.example} <= drawn
    assert len(drawn) >= 0.95 * len(seeds)
    assert all(case.seed in {s.name for s in runnable} for case in cases if case.command == "run")


def test_runnable_seeds_are_shrunk_to_two_steps():
    seeds, runnable = load_seeds()
    assert runnable and all(":steps 2\n" in seed.text for seed in runnable)
    assert shrink_for_run(":steps 200\n  :passes ((eval :every 50 :batches 4))") == \
        ":steps 2\n  :passes ((eval :every 1 :batches 1))"


# The judge itself: each failure class is recognised from what `main` prints.
@pytest.mark.parametrize("status, stderr, label", [
    (0, "", "ok"),
    (2, "case.sexp:3:7: error E-FORM-011: :steps must be at least 1, found -5.\n", "E-FORM-011"),
    (2, "step 1/2 loss 1\ncase.sexp:9:1: error E-SHAPE-001: add: shapes (3) and (4) do not broadcast.\n",
     "E-SHAPE-001"),
    (2, "error E-DATA-001: no record file at 'gone.npz'.\n", "E-DATA-001"),
    (2, "error E-S3-005: the AWS configuration cannot set up an S3 client: ...\n", "E-S3-005"),  # a digit in the area
    (2, "error E-SELECT-003: case.sexp has no defrun: there is nothing to run.\n", "E-SELECT-003"),
    (3, "internal error in sexpgpu 0.1.0: RecursionError: maximum recursion depth exceeded.\n", "internal"),
    (2, "memory: allocation failed; the run stopped.\n", "uncoded"),
    (2, "error E-FORM-011: :steps must be at least 1.\n", "unplaced"),
    (2, "error E-SELECT-003: exp.sexp has no defrun.\n", "unplaced"),
    (2, "case.sexp:1:2: error E-READ-007: 'de\x1b[31mf' is not a valid symbol.\n", "raw-control"),
    (2, "Traceback (most recent call last):\n  File x\nValueError\n", "traceback"),
    ("escaped", "Traceback (most recent call last):\n", "traceback"),
    (1, "", "status-1"),
])
def test_classify(status, stderr, label):
    outcome = classify(status, stderr)
    assert outcome.label == label
    assert outcome.failed == (label in FAILURE_LABELS or label.startswith("status-"))


@pytest.mark.parametrize("check, run, label", [
    (Outcome("ok", False), Outcome("ok", False), "ok"),
    (Outcome("ok", False), Outcome("E-INDEX-001", False), "E-INDEX-001"),
    (Outcome("ok", False), Outcome("E-FORM-011", False), "check-accepts-run-refuses"),
    (Outcome("E-FORM-011", False), Outcome("E-FORM-011", False), "E-FORM-011"),
    (Outcome("E-FORM-011", False), Outcome("E-FORM-002", False), "check-run-disagree"),
    (Outcome("internal", True), Outcome("ok", False), "internal"),
])
def test_judge_run(check, run, label):
    assert judge_run(check, run).label == label


def test_record_cases_are_functions_of_their_index_and_cover_every_maker(monkeypatch):
    seeds, runnable = load_seeds()
    first = [KINDS["records"](i, seeds, runnable) for i in range(60)]
    later = time.time() + 86_400  # a day later: nothing in a case may come from the clock (a zip's dates)
    monkeypatch.setattr(time, "time", lambda: later)
    assert first == [KINDS["records"](i, seeds, runnable) for i in range(60)]
    assert {case.mutations[0] for case in first} == {maker.name for maker in RECORD_MAKERS}
    assert all(case.command == "run" and f'"{RECORD_FILE}"' in case.text and case.files[0][0] == RECORD_FILE
               for case in first)
    assert len({case.files for case in first}) > 50, "record files should differ from each other"


def test_environment_cases_cover_every_setting_and_value_class():
    seeds, runnable = load_seeds()
    cases = [KINDS["environment"](i, seeds, runnable) for i in range(ENVIRONMENT_CASES)]
    assert cases == [KINDS["environment"](i, seeds, runnable) for i in range(ENVIRONMENT_CASES)]
    assert set(settings.SETTINGS) <= set(variables())
    assert {case.mutations[0] for case in cases} == {f"{name}={kind}" for name in variables() for kind in VALUE_CLASSES}
    assert all(case.s3 == name.startswith(("AWS_", "SEXPGPU_S3_")) for case in cases for name, _ in case.environ)


def _fuzz_shard(kind: str, cases, record_property, s3=None) -> None:
    summary = fuzz(cases, s3=s3)
    record_property("fuzz-summary", summary.record())
    failures = "\n".join(f"case {f.case.index} ({f.case.command} of {f.case.seed} after "
                         f"{', '.join(f.case.mutations)}): {f.outcome.label}: {f.outcome.detail[:300]!r}"
                         for f in summary.failures[:20])
    if summary.failures:
        pytest.fail(f"{summary.format()}\n{failures}\nReproduce one with: PYTHONPATH=src python "
                    f"tests/fuzz/fuzz_cli.py --kind {kind} --show INDEX", pytrace=False)


@pytest.mark.fuzz
@pytest.mark.parametrize("shard", range(SHARDS))
def test_fuzz(shard, record_property):
    """A shard takes every SHARDS-th case; the shards together run CASES cases."""
    seeds, runnable = load_seeds()
    _fuzz_shard("files", (make_case(index, seeds, runnable, Plan()) for index in range(shard, CASES, SHARDS)), record_property)


@pytest.mark.fuzz
@pytest.mark.parametrize("shard", range(KIND_SHARDS))
def test_fuzz_record_files(shard, record_property):
    """Malformed record files through check and a two-step run: RECORD_CASES cases in all."""
    seeds, runnable = load_seeds()
    cases = (KINDS["records"](index, seeds, runnable) for index in range(shard, RECORD_CASES, KIND_SHARDS))
    _fuzz_shard("records", cases, record_property)


@pytest.mark.fuzz
@pytest.mark.parametrize("shard", range(KIND_SHARDS))
def test_fuzz_environment(shard, record_property, s3_server):
    """Every setting and AWS_* value with every class of bad value, through check and a
    two-step run; the AWS_* and SEXPGPU_S3_* cases checkpoint to the test S3 server."""
    seeds, runnable = load_seeds()
    cases = (KINDS["environment"](index, seeds, runnable) for index in range(shard, ENVIRONMENT_CASES, KIND_SHARDS))
    _fuzz_shard("environment", cases, record_property, S3Target(s3_server.environment(), s3_server.new_bucket()))


def test_the_hand_runner_shows_a_case_and_counts_a_run(capsys, tmp_path):
    """tests/fuzz/fuzz_cli.py, as docs/architecture.md shows it: --show prints a case's file,
    and a run prints the summary and lists each failure, writing the failing files."""
    from fuzz_cli import main

    seeds, runnable = load_seeds()
    assert main(["--show", "49"]) == 0
    assert capsys.readouterr().out == make_case(49, seeds, runnable).text
    status = main(["--cases", "6", "--start", "45", "--jobs", "2", "--failures-out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("fuzz: 6 cases (5 check, 1 check+run) in ")
    written = sorted(tmp_path.iterdir())
    assert status == (1 if written else 0)
    assert len(written) == sum(int(line.split()[0]) for line in out.splitlines()[4:] if line.strip()[:1].isdigit())


def test_the_hand_runner_shows_and_runs_record_cases(capsysbinary):
    """--kind records: --show prints the case's record file; a run counts its cases."""
    from fuzz_cli import main

    seeds, runnable = load_seeds()
    assert main(["--kind", "records", "--show", "17"]) == 0
    assert capsysbinary.readouterr().out == KINDS["records"](17, seeds, runnable).files[0][1]
    assert main(["--kind", "records", "--cases", "3", "--jobs", "1"]) == 0
    assert capsysbinary.readouterr().out.startswith(b"fuzz: 3 cases (0 check, 3 check+run) in ")


def test_the_minimizer_keeps_the_outcome_and_drops_the_rest(tmp_path):
    """--minimize: a stray ')' at the end of an example shrinks to the ')' alone."""
    from fuzz_cli import minimize
    from fuzz_harness import Worker, worker_directory
    from fuzz_mutators import Case

    seeds, _ = load_seeds()
    text = next(seed.text for seed in seeds if seed.name == "teacher-student") + "\n)\n"
    case = Case(0, "check", "teacher-student", ("by-hand",), text)
    with worker_directory(tmp_path) as workdir:
        worker = Worker(workdir)
        try:
            outcome = worker.execute(case, 20)
            smaller = minimize(worker, case, outcome, 20)
        finally:
            worker.stop()
    assert outcome.label == "E-READ-002"
    assert smaller.text.strip() == ")"
