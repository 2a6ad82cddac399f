"""A run whose checkpoint upload stalls says so on stderr, among its progress lines, and stops
with E-S3-001 within SEXPGPU_S3_TIMEOUT (tests/store/test_s3_stalls.py has the operations)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))

import stalls  # noqa: E402
from test_checkpoint_hardening import run, tiny_file  # noqa: E402
from test_s3_stalls import DEADLINE, NOTICE, SLACK, waiting_lines, within  # noqa: E402


def test_a_run_whose_checkpoint_stalls_says_what_it_waits_for_and_stops(s3, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SEXPGPU_S3_TIMEOUT", str(DEADLINE))
    monkeypatch.setenv("SEXPGPU_S3_NOTICE", str(NOTICE))
    root = s3.uri("run")
    # the write check before the first step goes through; step 2's checkpoint gets no answer
    checkpoint = lambda line: "/run/step-2/" in line
    with stalls.Stalling(upstream=s3.server.endpoint, stalls=checkpoint) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.url)
        # the run's own start and two steps besides the deadline
        (status, _, err), _, _ = within(DEADLINE + SLACK + 20, lambda: run(
            capsys, tiny_file(tmp_path), tmp_path / "run-dir", "--checkpoint-to", root))
    assert status == 2 and "Traceback" not in err, err
    assert "error E-S3-001" in err and endpoint.url in err and "run/step-2/" in err
    lines = waiting_lines(err)
    assert lines and all("step-2/" in line.group(2) for line in lines)
    assert err.index("step 1/4") < err.index(lines[0].group(0)) < err.index("error E-S3-001")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.server.endpoint)
    assert not any(key.endswith("COMMITTED") for key in s3.keys())
