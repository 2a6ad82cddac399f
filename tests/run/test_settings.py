"""Every SEXPGPU_* setting is checked at the start of every command, on every backend, against
the one table in sexpgpu/settings.py; docs/settings.md is that table."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from sexpgpu import settings
from sexpgpu.cli.main import main
from sexpgpu.errors import SexpgpuError
from sexpgpu.store import TransferSettings

from test_cli import EXAMPLES, ROOT, metrics

MIB = 1024 * 1024


@pytest.fixture
def clean_environment(monkeypatch):
    for name in [name for name in os.environ if name.startswith("SEXPGPU_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def check_tiny(capsys) -> tuple[int, str]:
    status = main(["check", str(EXAMPLES / "tiny-adam.sexp"), "--device", "cpu"])
    return status, capsys.readouterr().err


@pytest.mark.parametrize("name, text, allowed", [
    ("SEXPGPU_OPTIMIZE", "max", "on, off"),
    ("SEXPGPU_DETERMINISTIC", "banana", "0, 1"),
    ("SEXPGPU_NODE_GRADIENTS", "fp8", "bf16, f32"),
    ("SEXPGPU_PATTERNS", "yes", "on, off"),
    ("SEXPGPU_PATTERNS", "maybe", "on, off"),
    ("SEXPGPU_S3_PART_SIZE", "abc", "5242880 (5 MiB) to 5368709120 (5 GiB)"),
    ("SEXPGPU_S3_PART_SIZE", str(5 * MIB - 1), "5242880 (5 MiB)"),
    ("SEXPGPU_S3_PART_SIZE", str(5 * 1024 * MIB + 1), "5368709120 (5 GiB)"),
    ("SEXPGPU_S3_WORKERS", "0", "1 to 64"),
    ("SEXPGPU_S3_TIMEOUT", "0.5", "seconds, from 1 to 86400"),
    ("SEXPGPU_S3_TIMEOUT", "forever", "seconds, from 1 to 86400"),
    ("SEXPGPU_S3_ATTEMPTS", "0", "1 to 10"),
    ("SEXPGPU_S3_NOTICE", "nan", "seconds, from 0.1 to 3600"),
    ("SEXPGPU_CPU_THREADS", "many", "1 to 1024"),
    ("SEXPGPU_CHOICES", "s3://", "fresh, or a path"),
    ("SEXPGPU_DEBUG", "yes", "0, 1"),
])
def test_a_bad_setting_stops_a_cpu_command_with_the_allowed_values(clean_environment, capsys, name, text, allowed):
    clean_environment.setenv(name, text)
    status, err = check_tiny(capsys)
    assert status == 2, err
    assert "E-CONFIG-001" in err and f"{name} is '{text}'" in err and allowed in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name, text", [
    ("SEXPGPU_OPTIMIZE", "Off"), ("SEXPGPU_DETERMINISTIC", "1"), ("SEXPGPU_NODE_GRADIENTS", "f32"),
    ("SEXPGPU_CHOICES", "fresh"), ("SEXPGPU_CHOICES", "s3://bucket/run/step-10"), ("SEXPGPU_S3_PART_SIZE", str(5 * MIB)),
    ("SEXPGPU_CPU_THREADS", "2"), ("SEXPGPU_DEBUG", "0"), ("SEXPGPU_PATTERNS", " OFF "),
    ("SEXPGPU_S3_TIMEOUT", "30"), ("SEXPGPU_S3_ATTEMPTS", "1"), ("SEXPGPU_S3_NOTICE", "0.5"),
])
def test_allowed_values_pass(clean_environment, capsys, name, text):
    clean_environment.setenv(name, text)
    status, err = check_tiny(capsys)
    assert status == 0, err
    assert "warning" not in err


def test_an_unknown_setting_is_a_warning_with_the_nearest_name(clean_environment, capsys):
    clean_environment.setenv("SEXPGPU_DETERMINSTIC", "1")
    status, err = check_tiny(capsys)
    assert status == 0
    assert "SEXPGPU_DETERMINSTIC is not a setting" in err and "Did you mean SEXPGPU_DETERMINISTIC?" in err


def test_a_long_unknown_name_is_warned_about_quickly(clean_environment):
    name = "SEXPGPU_" + "X" * 100_000
    clean_environment.setenv(name, "1")
    [warning] = settings.check_environment()
    assert "Did you mean" not in warning and len(warning) < 200


def test_the_store_reads_its_part_size_through_the_table(clean_environment):
    clean_environment.setenv("SEXPGPU_S3_PART_SIZE", "abc")
    with pytest.raises(SexpgpuError) as error:
        TransferSettings.from_env()
    assert error.value.code == "E-CONFIG-001"
    clean_environment.setenv("SEXPGPU_S3_PART_SIZE", str(6 * MIB))
    assert TransferSettings.from_env().part_size == 6 * MIB


def test_an_object_of_more_than_ten_thousand_parts_is_refused_before_upload():
    settings.check_part_count(10_000 * 5 * MIB, 5 * MIB)
    with pytest.raises(SexpgpuError) as error:
        settings.check_part_count(10_000 * 5 * MIB + 1, 5 * MIB)
    assert error.value.code == "E-CONFIG-001" and "at least 5242881" in error.value.message


def test_docs_list_every_setting_as_the_table_does():
    text = (ROOT / "docs" / "settings.md").read_text()
    rows = re.findall(r"^\| `(SEXPGPU_\w+)` \| (.*?) \| (.*?) \| (.*?) \|$", text, re.MULTILINE)
    documented = {name: (allowed, default) for name, allowed, default, _ in rows}
    expected = {name: (s.allowed, s.default) for name, s in settings.SETTINGS.items()}
    assert documented == expected


def test_the_messages_shown_in_docs_are_the_ones_printed(clean_environment, capsys):
    blocks = re.findall(r"```\n(.*?)\n```", (ROOT / "docs" / "settings.md").read_text(), re.DOTALL)
    clean_environment.setenv("SEXPGPU_OPTIMIZE", "max")
    assert check_tiny(capsys)[1].strip() == blocks[0]
    clean_environment.delenv("SEXPGPU_OPTIMIZE")
    clean_environment.setenv("SEXPGPU_DETERMINSTIC", "1")
    assert check_tiny(capsys)[1].strip() == blocks[1]


def two_steps(tmp_path) -> Path:
    """tiny-adam for two steps, a checkpoint at each."""
    text = (EXAMPLES / "tiny-adam.sexp").read_text().replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    path = tmp_path / "tiny.sexp"
    path.write_text(text.replace(":steps 200", ":steps 2").replace(":checkpoint 100", ":checkpoint 1"))
    return path


@pytest.mark.parametrize("blank", ["", " ", "\t \n"])
def test_a_blank_setting_is_an_unset_one_for_every_reader(clean_environment, capsys, tmp_path, blank):
    """docs/settings.md: a blank value, every setting's, the tests-only ones too, is unset. A run
    with all of them blank (its checkpoints pass the crash points, which read two of them)
    computes and records what a run with none set does."""
    tiny = two_steps(tmp_path)
    assert main(["run", str(tiny), "--device", "cpu", "--run-dir", str(tmp_path / "unset")]) == 0
    for name in settings.SETTINGS:
        clean_environment.setenv(name, blank)
    capsys.readouterr()
    assert main(["check", str(tiny)]) == 0
    assert main(["run", str(tiny), "--device", "cpu", "--run-dir", str(tmp_path / "blank")]) == 0, capsys.readouterr().err
    assert metrics(tmp_path / "blank") == metrics(tmp_path / "unset")
    recorded = [json.loads((tmp_path / run / "step-2" / "experiment.json").read_text()) for run in ("unset", "blank")]
    assert recorded[0]["environment"] == recorded[1]["environment"] == {"SEXPGPU_PATTERNS": "on"}
    assert recorded[0]["choices"] == recorded[1]["choices"]


@pytest.mark.parametrize("name, text", [("SEXPGPU_CPU_THREADS", "\u0661"), ("SEXPGPU_S3_WORKERS", "\uff12"),
                                        ("SEXPGPU_DIST_TIMEOUT", "\uff11\uff10")])
def test_numbers_are_ascii(clean_environment, name, text):
    """int() and float() read other scripts' digits; a setting does not."""
    clean_environment.setenv(name, text)
    with pytest.raises(SexpgpuError) as error:
        settings.check_environment()
    assert error.value.code == "E-CONFIG-001"


def test_a_checkpoint_recorded_with_a_setting_in_other_words_resumes(clean_environment, capsys, tmp_path):
    """A run records a setting as its value (`off`), not as the text given (`OFF `), and reads a
    checkpoint an older sexpgpu wrote with the text as a record of the value."""
    tiny = two_steps(tmp_path)
    clean_environment.setenv("SEXPGPU_OPTIMIZE", " OFF ")
    assert main(["run", str(tiny), "--device", "cpu", "--run-dir", str(tmp_path / "r")]) == 0
    record_path = tmp_path / "r" / "step-1" / "experiment.json"
    assert json.loads(record_path.read_text())["environment"]["SEXPGPU_OPTIMIZE"] == "off"
    clean_environment.setenv("SEXPGPU_OPTIMIZE", "off")
    shutil.rmtree(tmp_path / "r" / "step-2")
    assert main(["run", str(tiny), "--device", "cpu", "--run-dir", str(tmp_path / "r"), "--resume",
                 str(tmp_path / "r" / "step-1")]) == 0, capsys.readouterr().err
    assert settings.as_recorded({"SEXPGPU_OPTIMIZE": "Off", "SEXPGPU_PATTERNS": " ", "OTHER": 1}) == \
        {"SEXPGPU_OPTIMIZE": "off", "OTHER": 1}


# Functions that read the environment under a name they are given, none of them a setting's.
ENVIRONMENT_READERS = {("distributed/world.py", "_integer"): "torchrun's WORLD_SIZE, RANK, LOCAL_RANK, ..."}


def direct_setting_reads(text: str, relative: str) -> list[str]:
    """Where a source reads an environment variable other than through settings.py: a
    SEXPGPU_* name, or a name held in a variable (which might be one)."""
    found = []
    for function, node in _nodes_by_function(ast.parse(text), ""):
        key = _environment_key(node)
        if key is None:
            continue
        literal = isinstance(key, ast.Constant) and isinstance(key.value, str)
        if (literal and key.value.startswith("SEXPGPU_")) or \
                (not literal and (relative, function) not in ENVIRONMENT_READERS):
            found.append(f"{relative}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def _nodes_by_function(node, function: str):
    """(name of the innermost function around it, node) for every node under `node`."""
    for child in ast.iter_child_nodes(node):
        yield function, child
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
        yield from _nodes_by_function(child, inner)


def _environment_key(node):
    """The key of `<...>environ[key]`, `<...>environ.get(key)`, `key in <...>environ`,
    `os.getenv(key)`; else None."""
    def is_environ(value) -> bool:
        return ast.unparse(value).split(".")[-1] == "environ"

    if isinstance(node, ast.Subscript) and is_environ(node.value):
        return node.slice
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        if node.func.attr in ("get", "pop", "setdefault") and is_environ(node.func.value):
            return node.args[0]
        if node.func.attr == "getenv":
            return node.args[0]
    if isinstance(node, ast.Compare) and any(is_environ(right) for right in node.comparators) \
            and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        return node.left
    return None


SRC = ROOT / "src" / "sexpgpu"


def test_every_setting_is_read_through_the_settings_table():
    """One validator for every setting: no code but settings.py reads a SEXPGPU_* variable
    from the environment, so none can read a value that check_environment did not parse."""
    sources = [path for path in SRC.rglob("*.py") if path != SRC / "settings.py"]
    assert [line for path in sources for line in direct_setting_reads(path.read_text(), str(path.relative_to(SRC)))] == []


@pytest.mark.parametrize("read, flagged", [
    ('os.environ.get("SEXPGPU_DEBUG")', True), ('os.environ["SEXPGPU_DEBUG"]', True),
    ('"SEXPGPU_X" in os.environ', True), ('os.getenv("SEXPGPU_DEBUG", "")', True), ("environ.get(name)", True),
    ("{n: os.environ[n] for n in NAMES}", True), ('os.environ.get("AWS_ENDPOINT_URL")', False),
    ('"HOME" in os.environ', False), ("sorted(os.environ.items())", False),
])
def test_the_rule_sees_each_way_of_reading_the_environment(read, flagged):
    assert bool(direct_setting_reads(f"import os\ndef f(environ, name):\n    return {read}\n", "cli/main.py")) == flagged
