"""The `sexpgpu` command: argv in, exit status out. Bad input of any kind exits with status
2 and a one-paragraph message on stderr, never a Python traceback."""

from __future__ import annotations

import argparse
import os
import sys

from sexpgpu import __version__
from sexpgpu import settings
from sexpgpu.errors import SexpgpuError, redact
from sexpgpu.run.stopping import sigterm_as_interrupt, stop_of

DESCRIPTION = """\
SexpGPU trains neural networks from S-expression experiment files. A run's bits are a
function of the file, its selection and its flags; every run states its determinism level.

examples:
  sexpgpu run examples/tiny-adam.sexp              train on the default device
  sexpgpu run examples/char-lm.sexp --device cpu   train on the CPU interpreter
  sexpgpu check examples/char-lm.sexp              check and compile a file without running it
  sexpgpu run FILE --run-dir runs/a --resume latest
                                                   continue a run from its newest checkpoint
  sexpgpu checkpoint runs/a/step-100               show what a checkpoint holds
  sexpgpu ladder --quick                           check the determinism promises on the quick tiers

Documentation: docs/language.md (the experiment language), docs/errors.md (error codes).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sexpgpu", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sexpgpu {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(commands)
    _add_check(commands)
    _add_checkpoint(commands)
    _add_evaluate(commands)
    _add_diff(commands)
    _add_replay(commands)
    _add_plot(commands)
    _add_ladder(commands)
    return parser


def _add_selection(parser) -> None:
    parser.add_argument("file", metavar="FILE", help="an experiment file (.sexp)")
    parser.add_argument("selection", metavar="SELECTION", nargs="?",
                        help="the defrun to use; may be left out when the file has one")


def _add_run(commands) -> None:
    parser = commands.add_parser(
        "run", help="train a defrun", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compile a defrun, print its lowering report, and train it. The run directory gets "
                    "experiment.json, report.txt, metrics.jsonl (one line a step: loss, learning rate, "
                    "gradient norm, digest of the parameters' bits) and checkpoints.")
    _add_selection(parser)
    parser.add_argument("--run-dir", metavar="DIR", help="the run directory (default: a new folder under runs/); without --resume it must not "
                             "hold another run's files")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where to run: auto takes a GPU when one is usable (default: auto)")
    parser.add_argument("--resume", metavar="PATH|latest",
                        help="continue from a checkpoint: a step-<n> directory, an s3:// prefix, or 'latest' "
                             "(the newest committed checkpoint of the run directory or checkpoint destination)")
    parser.add_argument("--checkpoint-to", metavar="DIR|s3://BUCKET/PREFIX",
                        help="write checkpoints here instead of the run directory or the file's :to")
    parser.add_argument("--allow-layout-change", action="store_true",
                        help="resume even though the microbatch layout changed; the bits will then differ "
                             "from the uninterrupted run's")
    parser.add_argument("--choices", metavar="RECORD|fresh",
                        help="take the machine's choices recorded in a checkpoint (a step-<n> directory or "
                             "s3:// prefix), an experiment.json or a lowering annotation; or 'fresh' to choose "
                             "again, a resume too (default: SEXPGPU_CHOICES; see docs/determinism.md)")
    parser.add_argument("--deterministic", action="store_true",
                        help="take a fixed rule for every choice and measure nothing: bits that hold with no "
                             "record, a few percent slower (default: SEXPGPU_DETERMINISTIC=1)")


def _add_check(commands) -> None:
    parser = commands.add_parser(
        "check", help="check and compile a file, print the lowering report, run nothing",
        description="Read, check and compile a defrun, then print its lowering report. Exits with status 2 "
                    "and a message naming the file, line and column when the file is malformed.")
    _add_selection(parser)
    parser.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"),
                        help="the backend whose report to print (default: cpu)")


def _add_checkpoint(commands) -> None:
    parser = commands.add_parser(
        "checkpoint", help="show a checkpoint",
        description="Print a checkpoint's step, experiment name and digest, selection, flags, choices, "
                    "load pins, and each tensor's shape and dtype.")
    parser.add_argument("path", metavar="PATH", help="a step-<n> directory or s3://bucket/prefix/step-<n>")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--verify", action="store_true",
                        help="hash every file against its recorded SHA-256 and decode every tensor: prints OK, "
                             "or fails with E-CKPT-001 naming the first mismatch")


def _add_choice_flags(parser) -> None:
    parser.add_argument("--choices", metavar="RECORD|fresh",
                        help="take the machine's choices recorded in a checkpoint, an experiment.json or a lowering "
                             "annotation, or 'fresh' to choose here (level 3); see docs/determinism.md")
    parser.add_argument("--deterministic", action="store_true",
                        help="take a fixed rule for every choice and measure nothing")


def _add_rerun_flags(parser, doing: str) -> None:
    """What a command that computes again from a checkpoint takes: where, and the file."""
    parser.add_argument("--file", metavar="FILE",
                        help="the experiment file, when it is no longer at the path the run read it from")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help=f"where to {doing} (default: auto)")


def _add_evaluate(commands) -> None:
    parser = commands.add_parser(
        "evaluate", help="run a run's passes from its checkpoints",
        description="Run the passes of the run that wrote each checkpoint, from its parameters, unstacked, on this "
                    "machine. Prints the determinism line, each pass's eval values (as metrics.jsonl has them) and "
                    "the annotation 'evaluated offline on DEVICE: determinism LEVEL', which it also records in "
                    "evaluations/step-<n>.json beside the checkpoint. See docs/tools.md.")
    parser.add_argument("paths", metavar="RUN_DIR|CHECKPOINT", nargs="+",
                        help="a step-<n> directory or s3:// prefix, or a run directory (all its checkpoints)")
    parser.add_argument("--pass", dest="passes", metavar="NAME", action="append", default=[],
                        help="run only this pass (repeatable; default: every pass)")
    _add_rerun_flags(parser, "evaluate")
    _add_choice_flags(parser)


def _add_diff(commands) -> None:
    parser = commands.add_parser(
        "diff", help="say where two runs part",
        description="Compare two runs: the first step whose loss bits or parameter digest differ, the first "
                    "evaluation that differs, which tensors differ in the checkpoints both runs hold nearest that "
                    "step (max abs, max rel, how many elements), and the entries of their records (experiment, "
                    "flags, settings, choices) that differ. Exit status 0: identical; 1: different (an answer, "
                    "not an error); 2: bad input. See docs/tools.md.")
    parser.add_argument("run_a", metavar="RUN_A", help="a run directory, or its metrics.jsonl")
    parser.add_argument("run_b", metavar="RUN_B", help="a run directory, or its metrics.jsonl")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def _add_replay(commands) -> None:
    parser = commands.add_parser(
        "replay", help="compute a run's steps again from a checkpoint and compare",
        description="Recompute steps from a checkpoint on this machine, pinned to the checkpoint's choices, and "
                    "compare each step's loss bits and parameter digest with the run's metrics.jsonl. Exit status "
                    "0: every step matches; 1: names the first step that differs (an answer, not an error); "
                    "2: bad input. See docs/tools.md.")
    parser.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="a step-<n> directory or s3:// prefix, or a run directory (its oldest checkpoint)")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="how many steps to replay (default: every step the metrics log after the checkpoint)")
    parser.add_argument("--metrics", metavar="FILE",
                        help="the run's metrics.jsonl (default: the one beside the checkpoint)")
    _add_rerun_flags(parser, "replay")


def _add_plot(commands) -> None:
    parser = commands.add_parser(
        "plot", help="draw runs' loss and eval curves into a PNG",
        description="Draw the loss and eval curves of one or more runs on shared axes; with two runs, also their "
                    "per-step relative difference on a log scale, the first differing step marked. Needs "
                    "matplotlib: pip install 'sexpgpu[plot]'. See docs/tools.md.")
    parser.add_argument("runs", metavar="RUN", nargs="+", help="a run directory, or its metrics.jsonl")
    parser.add_argument("-o", "--output", metavar="FILE.png", required=True, help="the PNG to write")


def _add_ladder(commands) -> None:
    parser = commands.add_parser(
        "ladder", help="run the reference tiers and check every determinism promise",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the ladder's tiers (the reference ladder that comes with sexpgpu, or --ladder DIR) on\n"
                    "this machine and check each promise of docs/determinism.md on each: level 1, level 2,\n"
                    "level 3 (inside the tier's envelope), --deterministic, resume, evaluate, and :arithmetic\n"
                    "exact. Writes report.md, report.json and a plot a tier into the run directory. Exit status\n"
                    "0: every row passes (or is not run here); 1: a row fails (an answer, not an error); 2: bad\n"
                    "input. With --envelopes, measure the tiers' envelopes again on this device instead (into\n"
                    "the ladder folder's envelopes/). See docs/ladder.md.",
        epilog="examples:\n"
               "  sexpgpu ladder --quick --device cpu      the quick tiers on the CPU (CI)\n"
               "  sexpgpu ladder --device cuda             every tier on the GPU\n"
               "  sexpgpu ladder --envelopes --device cuda measure every tier's envelope again on the GPU")
    parser.add_argument("tiers", metavar="TIER", nargs="*", help="the tiers to run (default: every tier of the device)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where to run: auto takes a GPU when one is usable (default: auto)")
    parser.add_argument("--quick", action="store_true", help="only the tiers marked quick, when no TIER is named")
    parser.add_argument("--envelopes", action="store_true",
                        help="measure the tiers' envelopes again on this device and write them into the ladder folder "
                             "(the other devices' sources are kept)")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="where the report, plots and runs go: a new or empty directory (default: a new folder "
                             "under runs/)")
    parser.add_argument("--ladder", metavar="DIR",
                        help="the ladder folder: tiers.json, the tiers' files and envelopes/ (default: the reference "
                             "ladder that comes with sexpgpu)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with sigterm_as_interrupt():  # SIGTERM stops a command as Ctrl-C does (run/stopping.py)
            for warning in settings.check_environment():
                print(warning, file=sys.stderr)
            return _dispatch(args)
    except SexpgpuError as error:
        print(error.render(), file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        stop = stop_of(interrupt)
        print(f"stopped by {stop.name}.", file=sys.stderr)
        return stop.exit_status
    except BrokenPipeError:  # the reader of our output went away (`| head`): stop as a Unix filter does
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except MemoryError as error:  # one a run's step did not catch: setting up, a pass, a checkpoint
        from sexpgpu.run.allocation import allocation_failed_on_host

        print(allocation_failed_on_host(error, "while the command ran").render(), file=sys.stderr)
        return 2
    except Exception as error:  # an internal bug: say so in one paragraph, traceback on request
        if _debugging():
            raise
        print(f"internal error in sexpgpu {__version__}: {type(error).__name__}: {redact(str(error))}. This is a bug; "
              "run again with SEXPGPU_DEBUG=1 for the traceback and report it.", file=sys.stderr)
        return 3


EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a filter ended by SIGPIPE


def _debugging() -> bool:
    """SEXPGPU_DEBUG=1. Its value was checked before any command ran; an internal error in that
    check itself is reported without the traceback rather than hidden by another error."""
    try:
        return settings.value("SEXPGPU_DEBUG") == "1"
    except SexpgpuError:
        return False


def _drop_stdout() -> None:
    """Send what is still buffered for stdout nowhere, so that the interpreter's exit does not
    fail a second time flushing it into the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture): nothing buffered there
        pass
    finally:
        os.close(devnull)


def _dispatch(args) -> int:
    from sexpgpu.cli import commands

    return getattr(commands, args.command)(args)


if __name__ == "__main__":
    sys.exit(main())
