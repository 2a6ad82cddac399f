"""Every SEXPGPU_* setting is checked at the start of every command, on every backend, against
the one table in sexpgpu/settings.py; docs/settings.md is that table."""

from __future__ import annotations

import os
import re

import pytest

from sexpgpu import settings
from sexpgpu.cli.main import main
from sexpgpu.errors import SexpgpuError
from sexpgpu.store import TransferSettings

from test_cli import EXAMPLES, ROOT

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
