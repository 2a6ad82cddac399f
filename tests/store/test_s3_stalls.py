"""An S3 endpoint that stalls stops an operation within SEXPGPU_S3_TIMEOUT, with E-S3-001 naming
the endpoint, the operation and how long it waited, and says on stderr what it is waiting for
while it waits; a checkpoint whose upload stalls is never committed. The endpoints are real
sockets on the loopback address (tests/stalls.py), in front of moto's server where a request
is let through."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

import stalls
from sockets import listening_sockets
from store_samples import BF16, sample_record, sample_tensors, same_tensors
from sexpgpu.errors import SexpgpuError
from sexpgpu.store import read_checkpoint, resolve_checkpoint, write_checkpoint
from sexpgpu.store import s3_objects

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
DEADLINE, NOTICE = 1.0, 0.25
SLACK = 3.0  # scheduling on a loaded machine; a stall without the deadline takes minutes
WAITING = re.compile(r"waiting for S3 endpoint (\S+): (.+), (\d+) s so far, giving up after (\d+) s")


@pytest.fixture
def patience(s3, monkeypatch):
    """The test server's credentials, and a deadline and notices small enough for a test."""
    monkeypatch.setenv("SEXPGPU_S3_TIMEOUT", str(DEADLINE))
    monkeypatch.setenv("SEXPGPU_S3_NOTICE", str(NOTICE))
    return s3


def within(limit: float, action) -> tuple[object, BaseException | None, float]:
    """(what `action` returned, what it raised, its seconds), failing the test rather than
    waiting on past `limit` seconds."""
    outcome = {}

    def attempt():
        try:
            outcome["value"] = action()
        except BaseException as error:  # noqa: BLE001 - the test looks at what it was
            outcome["error"] = error

    started = time.monotonic()
    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(limit)
    assert not worker.is_alive(), f"still waiting on the stalled endpoint after {limit} s"
    return outcome.get("value"), outcome.get("error"), time.monotonic() - started


def waiting_lines(err: str) -> list[re.Match]:
    return [match for match in map(WAITING.fullmatch, err.splitlines()) if match]


@pytest.mark.parametrize("trickle", [None, 0.05], ids=["never-answers", "answers-slowly"])
def test_each_operation_on_a_stalled_endpoint_stops_with_E_S3_001_in_time(patience, monkeypatch, capsys, trickle):
    with stalls.Stalling(trickle=trickle) as endpoint:
        assert all(found.loopback_only for found in listening_sockets())
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.url)
        operations = [("reading", lambda: read_checkpoint(patience.uri("run/step-1"))),
                      ("listing checkpoints in", lambda: resolve_checkpoint("latest", patience.uri("run"))),
                      ("listing checkpoints in", lambda: write_checkpoint(
                          patience.uri("run"), 1, sample_tensors(1), sample_record(1), bf16=BF16))]
        for doing, operation in operations[: 1 if trickle else None]:  # a slow answer: one is enough
            capsys.readouterr()
            _, error, seconds = within(DEADLINE + SLACK, operation)
            assert isinstance(error, SexpgpuError) and error.code == "E-S3-001", error
            assert seconds >= DEADLINE * 0.9
            assert endpoint.url in error.message and doing in error.message and patience.bucket in error.message
            assert re.search(r"waited [\d.]+ s", error.message), error.message
            lines = waiting_lines(capsys.readouterr().err)
            assert lines, "no line said what the operation waits for"
            assert {line.group(1) for line in lines} == {endpoint.url}
            assert all(doing in line.group(2) and line.group(4) == "1" for line in lines)
        assert endpoint.stalled


def test_a_stalled_part_never_commits_its_checkpoint_and_its_line_names_the_part(patience, monkeypatch, capsys):
    monkeypatch.setenv("SEXPGPU_S3_MULTIPART_THRESHOLD", str(5 * MIB))
    monkeypatch.setenv("SEXPGPU_S3_PART_SIZE", str(5 * MIB))
    monkeypatch.setenv("SEXPGPU_S3_TIMEOUT", "3")  # the parts let through move 5 MiB each on a loaded machine
    root = patience.uri("run")
    write_checkpoint(root, 1, sample_tensors(1), sample_record(1), bf16=BF16)
    second = lambda line: re.match(r"PUT \S*[?&]partNumber=2\b", line)
    with stalls.Stalling(upstream=patience.server.endpoint, stalls=second) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.url)
        capsys.readouterr()
        _, error, _ = within(3 + SLACK, lambda: write_checkpoint(root, 2, sample_tensors(2, 11 * MIB),
                                                                 sample_record(2), bf16=BF16))
        assert isinstance(error, SexpgpuError) and error.code == "E-S3-001", error
        assert "run/step-2/model.safetensors" in error.message and "part 2 of 3" in error.message
        lines = waiting_lines(capsys.readouterr().err)
        # on a loaded machine a part let through may also wait past the notice: each line names its own part
        assert all("step-2/model.safetensors (part " in line.group(2) for line in lines)
        assert any("step-2/model.safetensors (part 2 of 3)" in line.group(2) for line in lines)
        assert endpoint.stalled
    monkeypatch.setenv("AWS_ENDPOINT_URL", patience.server.endpoint)
    assert not any(key.startswith("run/step-2/COMMITTED") for key in patience.keys())
    assert resolve_checkpoint("latest", root) == patience.uri("run/step-1")
    assert same_tensors(read_checkpoint(patience.uri("run/step-1")).tensors, sample_tensors(1))


def test_fast_operations_say_nothing(s3, monkeypatch, capsys):
    monkeypatch.setenv("SEXPGPU_S3_NOTICE", "5")
    write_checkpoint(s3.uri("run"), 1, sample_tensors(1), sample_record(1), bf16=BF16)
    read_checkpoint(resolve_checkpoint("latest", s3.uri("run")))
    assert capsys.readouterr().err == ""


def test_the_client_bounds_each_attempt_and_the_attempts(s3, monkeypatch):
    """The per-attempt timeouts and retries that sit inside the deadline (docs/checkpoints.md)."""
    monkeypatch.setenv("SEXPGPU_S3_TIMEOUT", "60")
    monkeypatch.setenv("SEXPGPU_S3_ATTEMPTS", "4")
    config = s3_objects.client().meta.config
    assert config.retries == {"total_max_attempts": 4, "mode": "standard"}
    assert config.read_timeout == 15 and config.connect_timeout == 10
    monkeypatch.setenv("SEXPGPU_S3_TIMEOUT", "6")
    config = s3_objects.client().meta.config
    assert config.read_timeout == 1.5 and config.connect_timeout == 1.5


def normalized(text: str) -> str:
    """The text with what differs between two runs (endpoint, bucket, numbers) replaced."""
    text = re.sub(r"http://127\.0\.0\.1:\d+", "ENDPOINT", text)
    text = re.sub(r"s3://[^/\s]+/", "s3://BUCKET/", text)
    return re.sub(r"\d+(\.\d+)?", "N", text)


def test_the_lines_shown_in_the_docs_are_the_ones_printed(patience, monkeypatch, capsys):
    section = (ROOT / "docs" / "checkpoints.md").read_text().split("## S3 access", 1)[1].split("\n## ", 1)[0]
    line, message = re.findall(r"```\n(.*?)\n```", section, re.DOTALL)
    with stalls.Stalling() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.url)
        capsys.readouterr()
        _, error, _ = within(DEADLINE + SLACK, lambda: s3_objects._request(
            patience.uri("run/step-10/model.safetensors"), "writing", lambda s3: s3.list_buckets(), " (part 3 of 5)"))
    assert normalized(error.render()) == normalized(message)
    assert normalized(waiting_lines(capsys.readouterr().err)[0].group(0)) == normalized(line)
