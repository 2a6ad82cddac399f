"""A real S3-compatible server for tests: moto's standalone server on the loopback address.

Tests talk to it over HTTP through boto3, exactly as they would to S3; nothing is mocked.

    server = S3Server.start()        # a subprocess on 127.0.0.1 and a free port
    server.environment()             # AWS_* variables that point boto3 at it
    server.stop()

The pytest fixtures at the bottom start one server per session (`s3_server`) and give each
test a fresh bucket and environment (`s3`). Import them into a conftest.py:

    from s3server import s3, s3_server  # noqa: F401
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass

import pytest

# Test-only credentials: moto accepts any, and tests check that these never reach a message.
ACCESS_KEY = "AKIATESTSEXPGPU00001"
SECRET_KEY = "sexpgpu-test-secret-0f3c9a7d5e1b"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class S3Server:
    process: subprocess.Popen
    port: int
    log: str

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, environment: dict | None = None, attempts: int = 3) -> "S3Server":
        """Start a server and wait until it answers; retry on another port if it dies."""
        for _ in range(attempts):
            port = free_port()
            log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False)
            process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(environment or {})})
            server = cls(process, port, log.name)
            if server._wait_ready(timeout=30):
                return server
            server.stop()
        raise RuntimeError(f"moto server did not start; see {log.name}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return True
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def environment(self) -> dict[str, str]:
        """AWS_* variables that point boto3 at this server and at nothing on the host."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_MAX_ATTEMPTS": "2",
            "AWS_RETRY_MODE": "standard",
        }

    def client(self, service: str = "s3", **credentials):
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=credentials.get("key", ACCESS_KEY),
                            aws_secret_access_key=credentials.get("secret", SECRET_KEY))

    def new_bucket(self) -> str:
        name = f"sexpgpu-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def require_authentication(self) -> None:
        """From now on, check every request's credentials against the server's IAM users."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).close()


@dataclass
class S3Bucket:
    """A fresh bucket on the session's server, with the environment pointing at it."""

    server: S3Server
    bucket: str

    def uri(self, *parts: str) -> str:
        return "/".join([f"s3://{self.bucket}", *parts])

    @property
    def client(self):
        return self.server.client()

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return S3Bucket(s3_server, s3_server.new_bucket())
