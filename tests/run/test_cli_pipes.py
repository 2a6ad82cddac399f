"""A reader that closes our output early (`sexpgpu ... | head`) ends the command as it ends a
Unix filter: status 141, no traceback, no internal error."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from sexpgpu.cli.main import EXIT_BROKEN_PIPE, main

ROOT = Path(__file__).resolve().parents[2]


class ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_is_not_an_internal_error(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    status = main(["check", str(ROOT / "examples" / "tiny-adam.sexp")])
    assert status == EXIT_BROKEN_PIPE
    assert "internal error" not in capsys.readouterr().err


def test_head_of_a_report_in_a_shell_pipe(tmp_path):
    # the reader exits at once; the writer's status is read from the pipeline
    command = (f"{sys.executable} -m sexpgpu.cli.main check {ROOT / 'examples' / 'char-lm.sexp'} "
               "| (exec 0<&-; true); echo ${PIPESTATUS[0]}")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() in ("0", str(EXIT_BROKEN_PIPE))
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
