"""Fixtures for run-level tests: the real S3 server of tests/s3server.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from s3server import s3, s3_server  # noqa: E402,F401
