"""One function a subcommand: each turns parsed arguments into calls of the run and store
stages and returns the exit status."""

from __future__ import annotations

import json
import sys


def run(args) -> int:
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.session import RunOptions, execute

    experiment = load_experiment(args.file, args.selection)
    options = RunOptions.from_flags(args.device, args.choices, args.deterministic, run_dir=args.run_dir,
                                    resume=args.resume, checkpoint_to=args.checkpoint_to,
                                    allow_layout_change=args.allow_layout_change)
    outcome = execute(experiment, options)
    return outcome.stop.exit_status if outcome.stop else 0


def check(args) -> int:
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.report import lowering_report
    from sexpgpu.run.setup import build_run, memory_problem

    experiment = load_experiment(args.file, args.selection)
    built = build_run(experiment, args.device, read_loads=False, holds=None)
    print(lowering_report(experiment, built.program, built.backend_facts, built.memory, built.data_identity))
    problem = memory_problem(built)  # the file is sound; this machine is too small for it
    if problem is not None:
        print(f"warning: `sexpgpu run` here stops with {problem.code} before its first step: {problem.message} "
              f"{problem.hint}", file=sys.stderr)
    return 0


def checkpoint(args) -> int:
    from sexpgpu.store import describe_checkpoint, format_checkpoint, format_verified, verify_checkpoint

    if args.verify:
        verified = verify_checkpoint(args.path)
        print(json.dumps(vars(verified), sort_keys=True) if args.json else format_verified(verified))
        return 0
    description = describe_checkpoint(args.path)
    if args.json:
        json.dump(description, sys.stdout, indent=2, sort_keys=True)
        print()
    else:
        print(format_checkpoint(description))
    return 0


def evaluate(args) -> int:
    from sexpgpu.run.choosing import choice_settings
    from sexpgpu.tools.evaluating import EvaluateOptions, evaluate as evaluate_checkpoints

    options = EvaluateOptions(device=args.device, passes=tuple(args.passes), file=args.file,
                              choices=choice_settings(args.choices, args.deterministic))
    evaluate_checkpoints(args.paths, options)
    return 0


def diff(args) -> int:
    from sexpgpu.tools.comparing import diff_runs, format_diff, read_run

    found = diff_runs(read_run(args.run_a), read_run(args.run_b))
    print(json.dumps(found.to_json(), indent=2, sort_keys=True) if args.json else format_diff(found))
    return 0 if found.identical else 1


def replay(args) -> int:
    from sexpgpu.tools.replaying import ReplayOptions, replay as replay_steps

    options = ReplayOptions(steps=args.steps, metrics=args.metrics, file=args.file, device=args.device)
    return 0 if replay_steps(args.checkpoint, options).differing is None else 1


def plot(args) -> int:
    from sexpgpu.tools.plotting import plot_runs

    print(f"wrote {plot_runs(args.runs, args.output)}")
    return 0


def ladder(args) -> int:
    from sexpgpu.ladder.climb import LadderOptions, regenerate_envelopes, run_ladder
    from sexpgpu.ladder.tiers import REFERENCE

    options = LadderOptions(tiers=tuple(args.tiers), device=args.device, quick=args.quick, run_dir=args.run_dir,
                            folder=args.ladder or REFERENCE)
    if args.envelopes:
        regenerate_envelopes(options)
        return 0
    return 1 if run_ladder(options).failed else 0
