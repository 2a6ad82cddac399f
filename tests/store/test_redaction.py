"""No message shows a credential: not the user part of AWS_ENDPOINT_URL, not a secret the
environment holds. Checked through the command line, against the real moto server and
against an endpoint where nothing listens."""

from __future__ import annotations

import pytest

from s3server import SECRET_KEY, free_port
from sexpgpu.cli.main import main
from sexpgpu.errors import SexpgpuError, redact

URL_KEY, URL_SECRET = "AKIAURLKEY0000EXAMPLE", "url-secret-5d1e0c77b2"


def command_output(capsys, *argv) -> tuple[int, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def assert_no_credentials(text: str) -> None:
    for secret in (URL_KEY, URL_SECRET, SECRET_KEY):
        assert secret not in text, text


def test_endpoint_credentials_are_not_printed_when_the_endpoint_is_unreachable(s3, monkeypatch, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{URL_KEY}:{URL_SECRET}@127.0.0.1:{free_port()}")
    status, text = command_output(capsys, "checkpoint", s3.uri("run/step-1"))
    assert status == 2 and "E-S3-001" in text and "127.0.0.1" in text and "***@127.0.0.1" in text
    assert_no_credentials(text)


def test_endpoint_credentials_are_not_printed_by_a_server_that_answers(s3, monkeypatch, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{URL_KEY}:{URL_SECRET}@127.0.0.1:{s3.server.port}")
    status, text = command_output(capsys, "checkpoint", s3.uri("no-such-run/step-1"))
    assert status == 2 and "error E-" in text
    assert_no_credentials(text)


def test_secrets_of_the_environment_are_never_shown(s3, tmp_path, capsys):
    missing = tmp_path / SECRET_KEY / "model.sexp"  # a path that happens to hold the secret
    status, text = command_output(capsys, "check", str(missing))
    assert status == 2 and "error E-" in text and "***" in text
    assert_no_credentials(text)


@pytest.mark.parametrize("shown, redacted", [
    ("http://KEY:SECRET@host:9000/bucket", "http://***@host:9000/bucket"),
    ('could not reach "https://user@s3.example/x"', 'could not reach "https://***@s3.example/x"'),
    ("s3://KEY:SECRET@bucket/prefix", "s3://***@bucket/prefix"),
    ("http://host:9000/a@b", "http://host:9000/a@b"),  # an @ in the path is no credential
    ("plain text, user@example.org", "plain text, user@example.org"),
])
def test_redact_removes_the_user_part_of_urls_only(shown, redacted):
    assert redact(shown) == redacted
    assert SexpgpuError("E-S3-001", shown, hint=shown).render() == f"error E-S3-001: {redacted} {redacted}"


def test_redact_hides_secret_variables_but_not_where_secrets_are_kept(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_token_value_123")
    monkeypatch.setenv("DATABASE_PASSWORD", "pa55word")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token-file")
    shown = "hf_token_value_123 pa55word /var/run/token-file"
    assert redact(shown) == "*** *** /var/run/token-file"
