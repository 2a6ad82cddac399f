"""docs/errors.md lists every code the store raises, and a store test triggers each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sexpgpu.errors import SexpgpuError
from sexpgpu.store import read_checkpoint, resolve_checkpoint, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CODE = re.compile(r"E-[A-Z0-9]+-\d{3}")
SECTION = "## Checkpoints and loaded weights"


def documented() -> set[str]:
    text = (ROOT / "docs" / "errors.md").read_text()
    section = text.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
    return {CODE.match(line[2:]).group(0) for line in section.splitlines() if line.startswith("| E-")}


def raised() -> set[str]:
    return {code for path in (ROOT / "src" / "sexpgpu" / "store").glob("*.py") for code in CODE.findall(path.read_text())}


def test_every_code_the_store_raises_is_documented_and_no_other():
    assert raised() == documented()


def test_every_store_code_is_triggered_by_a_store_test():
    tests = "".join(path.read_text() for path in (ROOT / "tests" / "store").glob("test_*.py"))
    for code in documented():
        assert f'"{code}"' in tests, code


def test_an_s3_uri_without_a_bucket_is_E_S3_004():
    for attempt in (lambda: resolve_checkpoint("latest", "s3://"), lambda: read_checkpoint("s3:///step-1")):
        with pytest.raises(SexpgpuError) as caught:
            attempt()
        assert caught.value.code == "E-S3-004"


def test_a_request_boto3_refuses_to_send_is_E_S3_004(s3):
    with pytest.raises(SexpgpuError) as caught:
        write_checkpoint("s3://a bucket with spaces/run", 1, {}, {})
    assert caught.value.code == "E-S3-004" and "a bucket with spaces" in caught.value.message
