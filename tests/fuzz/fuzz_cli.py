"""Run the fuzzer by hand, with more cases than CI runs, and see each failure class.

    PYTHONPATH=src python tests/fuzz/fuzz_cli.py --cases 50000 --jobs 2
    PYTHONPATH=src python tests/fuzz/fuzz_cli.py --show 4711 > case.sexp   # one case's file
    PYTHONPATH=src python tests/fuzz/fuzz_cli.py --cases 5000 --failures-out fuzz-failures/

It prints the summary the test prints, then one line for each distinct failure (its class, the
exception or message, the mutations, and the index of its smallest case), and with
--failures-out writes every failing case's file there, named by index and class. The cases are
those of the test: the same seed and index give the same file.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_harness import Failure, Limits, Summary, fuzz  # noqa: E402
from fuzz_mutators import Plan, load_seeds, make_case  # noqa: E402


def cases_for(job: int, jobs: int, start: int, count: int, plan: Plan):
    seeds, runnable = load_seeds()
    return (make_case(index, seeds, runnable, plan) for index in range(start + job, start + count, jobs))


def run_jobs(start: int, count: int, jobs: int, plan: Plan, limits: Limits) -> Summary:
    """`jobs` workers side by side, each taking every jobs-th case."""
    summaries = [Summary() for _ in range(jobs)]

    def work(job):
        summaries[job] = fuzz(cases_for(job, jobs, start, count, plan), limits)

    threads = [threading.Thread(target=work, args=(job,)) for job in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = Summary()
    for summary in summaries:
        total.merge(summary)
    return total


def signature(failure: Failure) -> str:
    """What makes two failures the same: the class and the exception (or the code) named."""
    named = re.search(r"\b(\w+(?:Error|Exception|Exit|Interrupt))\b", failure.outcome.detail)
    return f"{failure.outcome.label} {named.group(1) if named else ''}".strip()


def describe_failures(failures: list[Failure]) -> list[str]:
    groups: dict[str, list[Failure]] = {}
    for failure in failures:
        groups.setdefault(signature(failure), []).append(failure)
    lines = []
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        smallest = min(members, key=lambda f: len(f.case.text))
        mutations = sorted({m for f in members for m in f.case.mutations})
        lines.append(f"{len(members):6d}  {key}  [{', '.join(mutations)}]  smallest: case {smallest.case.index} "
                     f"({smallest.case.command} of {smallest.case.seed}, {len(smallest.case.text)} chars): "
                     f"{smallest.outcome.detail[:300]!r}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = parser.parse_args(argv)
    plan = Plan(args.seed, args.run_every)
    if args.show is not None:
        seeds, runnable = load_seeds()
        case = make_case(args.show, seeds, runnable, plan)
        print(f"; case {case.index}: {case.command} of {case.seed} after {', '.join(case.mutations)}", file=sys.stderr)
        sys.stdout.buffer.write(case.data())
        return 0
    limits = Limits(check_seconds=args.time_limit, max_hangs=args.max_hangs)
    summary = run_jobs(args.start, args.cases, args.jobs, plan, limits)
    print(summary.format())
    for line in describe_failures(summary.failures):
        print(line)
    if args.failures_out:
        args.failures_out.mkdir(parents=True, exist_ok=True)
        for failure in summary.failures:
            name = f"{failure.case.index:07d}-{failure.case.command}-{failure.outcome.label}.sexp"
            (args.failures_out / name).write_bytes(failure.case.data())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
