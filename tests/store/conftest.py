"""Fixtures for the store tests: a real S3 server (tests/s3server.py) and small tensors."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from s3server import s3, s3_server  # noqa: E402,F401
