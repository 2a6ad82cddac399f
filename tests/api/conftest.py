"""Fixtures for the Python API's tests: tests/run's short tiny-adam and fresh HOME, and the S3
server of tests/s3server.py."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "run")]

from s3server import s3, s3_server  # noqa: E402,F401
from test_choosing import home, tiny  # noqa: E402,F401  (tiny-adam: 6 steps, a checkpoint and an evaluation every 3)
