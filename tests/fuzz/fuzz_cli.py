"""Run the fuzzer by hand, with more cases than CI runs, and see each failure class.

    PYTHONPATH=src python tests/fuzz/fuzz_cli.py --cases 50000 --jobs 2
    PYTHONPATH=src python tests/fuzz/fuzz_cli.py --show 4711 > case.sexp   # one case's file
    PYTHONPATH=src python tests/fuzz/fuzz_cli.py --cases 5000 --failures-out fuzz-failures/
    PYTHONPATH=src python tests/fuzz/fuzz_cli.py --kind records --cases 2000   # record files
    PYTHONPATH=src python tests/fuzz/fuzz_cli.py --kind environment --cases 322  # every setting

It prints the summary the test prints, then one line for each distinct failure (its class, the
exception or message, the mutations, and the index of its smallest case), and with
--failures-out writes every failing case's files there, named by index and class. The cases are
those of the test: the same kind, seed and index give the same files and environment. The
environment kind starts the test S3 server (tests/s3server.py) for its AWS_* cases.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz_harness import KINDS, Failure, Limits, Outcome, S3Target, Summary, Worker, fuzz, worker_directory  # noqa: E402
from fuzz_mutators import Case, Plan, load_seeds, tokens  # noqa: E402


def cases_for(job: int, jobs: int, start: int, count: int, plan: Plan, kind: str = "files"):
    seeds, runnable = load_seeds()
    return (KINDS[kind](index, seeds, runnable, plan) for index in range(start + job, start + count, jobs))


@contextlib.contextmanager
def s3_target(kind: str):
    """The test S3 server and a bucket for the environment kind's S3 cases; None for the others."""
    if kind != "environment":
        yield None
        return
    from s3server import S3Server

    server = S3Server.start()
    try:
        yield S3Target(server.environment(), server.new_bucket())
    finally:
        server.stop()


def run_jobs(start: int, count: int, jobs: int, plan: Plan, limits: Limits, kind: str = "files",
             s3: S3Target | None = None) -> Summary:
    """`jobs` workers side by side, each taking every jobs-th case."""
    summaries = [Summary() for _ in range(jobs)]

    def work(job):
        summaries[job] = fuzz(cases_for(job, jobs, start, count, plan, kind), limits, s3=s3)

    threads = [threading.Thread(target=work, args=(job,)) for job in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = Summary()
    for summary in summaries:
        total.merge(summary)
    return total


def signature(outcome: Outcome) -> str:
    """What makes two failures the same: the class, and the exception and the first words of
    its message (numbers and quoted names blanked), or the code of the message."""
    detail = re.sub(r"'[^']*'|\d+", "_", outcome.detail)
    named = re.search(r"\b(\w+(?:Error|Exception|Exit|Interrupt)): ((?:\S+ ){0,4})", detail)
    if named:
        return f"{outcome.label} {named.group(1)}: {named.group(2).strip()}"
    code = re.search(r"error (E-[A-Z]+-\d{3})", outcome.detail)
    return f"{outcome.label} {code.group(1) if code else ''}".strip()


def minimize(worker: Worker, case: Case, outcome: Outcome, time_limit: float, attempts: int = 300) -> Case:
    """A smaller file with the same failure: delete runs of tokens, long runs first, while the
    signature stays (hangs are not minimized: each try would cost the time limit)."""
    if outcome.label == "hang":
        return case
    wanted, toks = signature(outcome), tokens(case.text)
    chunk = max(1, len(toks) // 2)
    while chunk >= 1 and attempts > 0:
        start = 0
        while start < len(toks) and attempts > 0:
            trial = toks[:start] + toks[start + chunk:]
            attempts -= 1
            candidate = dataclasses.replace(case, text="".join(trial))
            if signature(worker.execute(candidate, time_limit)) == wanted:
                toks = trial
            else:
                start += chunk
        chunk //= 2
    return dataclasses.replace(case, text="".join(toks))


def group_failures(failures: list[Failure]) -> dict[str, list[Failure]]:
    groups: dict[str, list[Failure]] = {}
    for failure in failures:
        groups.setdefault(signature(failure.outcome), []).append(failure)
    return groups


def describe_failures(failures: list[Failure]) -> list[str]:
    groups = group_failures(failures)
    lines = []
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        smallest = min(members, key=lambda f: len(f.case.text))
        mutations = sorted({m for f in members for m in f.case.mutations})
        indices = ", ".join(str(f.case.index) for f in members[:8]) + (", ..." if len(members) > 8 else "")
        lines.append(f"{len(members):6d}  {key}  [{', '.join(mutations)}]  cases {indices}; smallest: case "
                     f"{smallest.case.index} ({smallest.case.command} of {smallest.case.seed}, "
                     f"{len(smallest.case.text)} chars): {smallest.outcome.detail[:300]!r}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=tuple(KINDS), default="files",
                        help="experiment files (default), record files, or environment values")
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--start", type=int, default=0, help="the first case index")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=Plan().seed)
    parser.add_argument("--run-every", type=int, default=Plan().run_every,
                        help="every N-th case also runs two steps (0: none)")
    parser.add_argument("--time-limit", type=float, default=Limits().check_seconds,
                        help="seconds a check may take before it counts as a hang")
    parser.add_argument("--max-hangs", type=int, default=10**9, help="stop a job after this many hangs")
    parser.add_argument("--show", type=int, metavar="INDEX", help="print one case's file and exit")
    parser.add_argument("--failures-out", type=Path, metavar="DIR", help="write each failing case here")
    parser.add_argument("--minimize", type=Path, metavar="DIR",
                        help="shrink the smallest case of each failure class and write it here")
    args = parser.parse_args(argv)
    plan = Plan(args.seed, args.run_every)
    if args.show is not None:
        seeds, runnable = load_seeds()
        case = KINDS[args.kind](args.show, seeds, runnable, plan)
        variables = "".join(f"; {name}={value!r}" for name, value in case.environ)
        print(f"; case {case.index}: {case.command} of {case.seed} after {', '.join(case.mutations)}{variables}",
              file=sys.stderr)
        # a record case's record file; else the experiment file
        sys.stdout.buffer.write(case.files[0][1] if case.files else case.data())
        return 0
    limits = Limits(check_seconds=args.time_limit, max_hangs=args.max_hangs)
    with s3_target(args.kind) as s3:
        summary = run_jobs(args.start, args.cases, args.jobs, plan, limits, args.kind, s3)
    print(summary.format())
    for line in describe_failures(summary.failures):
        print(line)
    if args.failures_out:
        args.failures_out.mkdir(parents=True, exist_ok=True)
        for failure in summary.failures:
            stem = f"{failure.case.index:07d}-{failure.case.command}-{failure.outcome.label}"
            (args.failures_out / f"{stem}.sexp").write_bytes(failure.case.data())
            for name, data in failure.case.files:
                (args.failures_out / f"{stem}-{name}").write_bytes(data)
    if args.minimize:
        write_minimized(summary.failures, args.minimize, args.time_limit)
    return 1 if summary.failures else 0


def write_minimized(failures: list[Failure], directory: Path, time_limit: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with worker_directory() as workdir:
        worker = Worker(workdir)
        try:
            for number, (key, members) in enumerate(group_failures(failures).items()):
                smallest = min(members, key=lambda f: len(f.case.text))
                case = minimize(worker, smallest.case, smallest.outcome, time_limit)
                name = directory / f"{number:02d}-{smallest.case.command}-{smallest.outcome.label}.sexp"
                name.write_bytes(case.data())
                print(f"{name}: {key} ({len(case.text)} chars, from case {case.index})")
        finally:
            worker.stop()


if __name__ == "__main__":
    sys.exit(main())
