"""Every file under tests/malformed/ gives its documented error at its line and column.

Each file opens with comment lines:
    ; expect: E-CODE-NNN at LINE:COL     (or without `at ...` for an error with no place in the file)
    ; message: SUBSTRING                 (any number: each must appear in the rendered message)
    ; select: NAME                       (optional: the run selection to load with)
Files directly under tests/malformed/ fail in the reader or the forms stage; files under
tests/malformed/graph/ fail when the graph stage compiles them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import sexpgpu
from sexpgpu.errors import Location, SexpgpuError
from sexpgpu.lang.forms import load_experiment

MALFORMED = Path(__file__).resolve().parent.parent / "malformed"
FORM_FILES = sorted(MALFORMED.glob("*.sexp"))
GRAPH_FILES = sorted((MALFORMED / "graph").glob("*.sexp"))
_EXPECT = re.compile(r"; expect: (E-[A-Z]+-\d{3})(?: at (\d+):(\d+))?\s*$")


@dataclass(frozen=True)
class Expectation:
    code: str
    line: int | None
    column: int | None
    messages: tuple[str, ...]
    selection: str | None


def read_expectation(path: Path) -> Expectation:
    header = []
    for raw in path.read_bytes().split(b"\n"):
        if not raw.startswith(b";"):
            break
        header.append(raw.decode("ascii"))
    match = _EXPECT.match(header[0])
    assert match, f"{path} must open with '; expect: E-CODE-NNN at LINE:COL'"
    code, line, column = match.groups()
    messages = tuple(h[len("; message: "):] for h in header if h.startswith("; message: "))
    selections = [h[len("; select: "):] for h in header if h.startswith("; select: ")]
    return Expectation(
        code, int(line) if line else None, int(column) if column else None, messages,
        selections[0] if selections else None,
    )


def assert_reported(error: SexpgpuError, path: Path, expect: Expectation) -> None:
    rendered = error.render()
    assert error.code == expect.code, rendered
    if expect.line is None:
        assert error.location is None, rendered
        assert str(path) in rendered
    else:
        assert error.location == Location(str(path), expect.line, expect.column), rendered
        assert rendered.startswith(f"{path}:{expect.line}:{expect.column}: error {expect.code}: "), rendered
    for message in expect.messages:
        assert message in rendered, f"{message!r} not in {rendered!r}"
    assert "Traceback" not in rendered and "\n" not in rendered, "one paragraph, no traceback"


def _name(path: Path) -> str:
    return path.stem


def test_there_are_enough_malformed_files():
    assert len(FORM_FILES) >= 40
    assert len(GRAPH_FILES) >= 8


@pytest.mark.parametrize("path", FORM_FILES, ids=_name)
def test_malformed_file_gives_its_error(path):
    expect = read_expectation(path)
    with pytest.raises(SexpgpuError) as caught:
        load_experiment(str(path), expect.selection)
    assert_reported(caught.value, path, expect)


def _compile_program():
    import sexpgpu.graph

    compile_program = getattr(sexpgpu.graph, "compile_program", None)
    if compile_program is None:
        pytest.skip("graph stage not built yet")
    return compile_program


@pytest.mark.parametrize("path", GRAPH_FILES, ids=_name)
def test_malformed_graph_file_passes_forms_and_fails_in_the_graph_stage(path):
    expect = read_expectation(path)
    experiment = load_experiment(str(path), expect.selection)  # the forms stage accepts it
    compile_program = _compile_program()
    with pytest.raises(SexpgpuError) as caught:
        compile_program(experiment)
    assert_reported(caught.value, path, expect)


# --- the command line: `sexpgpu check FILE [SELECTION]` exits 2 with the message on stderr ---

def _cli_available() -> bool:
    """`check` runs the whole front end, so it needs the command line and the graph stage."""
    try:
        from sexpgpu.cli.main import main  # noqa: F401
    except ImportError:
        return False
    import sexpgpu.graph

    return hasattr(sexpgpu.graph, "compile_program")


def run_check(path: Path, selection: str | None = None) -> subprocess.CompletedProcess:
    """`python -m sexpgpu check FILE [SELECTION]`, with this checkout's package importable."""
    source_root = str(Path(sexpgpu.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [source_root, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "sexpgpu", "check", str(path)] + ([selection] if selection else [])
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def _one_file_per_code(files) -> list[Path]:
    chosen = {}
    for path in files:
        chosen.setdefault(read_expectation(path).code, path)
    return [chosen[code] for code in sorted(chosen)]


@pytest.mark.skipif(not _cli_available(), reason="sexpgpu.cli.main or the graph stage does not exist yet")
@pytest.mark.parametrize("path", _one_file_per_code(FORM_FILES) + _one_file_per_code(GRAPH_FILES), ids=_name)
def test_check_command_exits_2_with_the_message_and_no_traceback(path):
    expect = read_expectation(path)
    result = run_check(path, expect.selection)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert f"error {expect.code}" in result.stderr
    if expect.line is not None:
        assert f"{path}:{expect.line}:{expect.column}:" in result.stderr
    for message in expect.messages:
        assert message in result.stderr
