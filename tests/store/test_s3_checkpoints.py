"""Checkpoints on a real S3-compatible server (moto's, over HTTP): commit markers, multipart
uploads, retention, crashes, and the S3 errors."""

from __future__ import annotations

import json
import signal

import pytest

import checkpoint_child
from s3server import SECRET_KEY, S3Server, free_port
from store_samples import BF16, sample_record, sample_tensors, same_tensors
from sexpgpu.errors import SexpgpuError
from sexpgpu.store import s3_store
from sexpgpu.store import list_checkpoints, read_checkpoint, resolve_checkpoint, verify_checkpoint, write_checkpoint

MIB = 1024 * 1024
FILES = ["COMMITTED", "experiment.json", "model.safetensors", "optimizer.safetensors"]


def write(root, step, big_bytes=0, **kwargs):
    return write_checkpoint(root, step, sample_tensors(step, big_bytes), sample_record(step), bf16=BF16, **kwargs)


def small_parts(monkeypatch):
    """Multipart from 5 MiB up, in 5 MiB parts: S3's smallest."""
    monkeypatch.setenv("SEXPGPU_S3_MULTIPART_THRESHOLD", str(5 * MIB))
    monkeypatch.setenv("SEXPGPU_S3_PART_SIZE", str(5 * MIB))


def test_a_checkpoint_round_trips_through_s3(s3):
    path = write(s3.uri("runs/a"), 7)
    assert path == s3.uri("runs/a/step-7")
    assert s3.keys() == [f"runs/a/step-7/{name}" for name in FILES]
    checkpoint = read_checkpoint(path)
    assert checkpoint.step == 7 and same_tensors(checkpoint.tensors, sample_tensors(7))
    assert {k: checkpoint.experiment[k] for k in sample_record(7)} == sample_record(7)


def test_a_large_tensor_file_goes_up_in_parts_and_comes_back_exact(s3, monkeypatch):
    small_parts(monkeypatch)
    path = write(s3.uri("run"), 1, big_bytes=12 * MIB)
    etag = s3.client.head_object(Bucket=s3.bucket, Key="run/step-1/model.safetensors")["ETag"]
    assert etag.strip('"').endswith("-3")  # three parts: 5 + 5 + a little over 2 MiB
    assert "-" not in s3.client.head_object(Bucket=s3.bucket, Key="run/step-1/optimizer.safetensors")["ETag"]
    assert same_tensors(read_checkpoint(path).tensors, sample_tensors(1, 12 * MIB))


def test_a_bucket_root_works_as_a_run_root(s3):
    path = write(s3.uri(), 2)
    assert path == s3.uri("step-2")
    assert resolve_checkpoint("latest", s3.uri()) == path


def test_a_prefix_without_its_marker_is_not_a_checkpoint(s3):
    write(s3.uri("run"), 1)
    write(s3.uri("run"), 2)
    s3.client.delete_object(Bucket=s3.bucket, Key="run/step-2/COMMITTED")  # as if the marker never went up
    assert resolve_checkpoint("latest", s3.uri("run")) == s3.uri("run/step-1")
    assert list_checkpoints(s3.uri("run")) == [(1, s3.uri("run/step-1"))]
    with pytest.raises(SexpgpuError) as caught:
        read_checkpoint(s3.uri("run/step-2"))
    assert caught.value.code == "E-CKPT-003" and "[1]" in caught.value.message
    # A checkpoint's sibling prefixes do not count, nor do nested ones.
    write(s3.uri("run-b"), 9)
    write(s3.uri("run/inner"), 8)
    assert resolve_checkpoint("latest", s3.uri("run")) == s3.uri("run/step-1")


def test_missing_steps_on_s3(s3):
    with pytest.raises(SexpgpuError) as caught:
        resolve_checkpoint("latest", s3.uri("nothing-here"))
    assert caught.value.code == "E-CKPT-003"
    write(s3.uri("run"), 3)
    with pytest.raises(SexpgpuError) as caught:
        resolve_checkpoint(s3.uri("run/step-4"), s3.uri("run"))
    assert caught.value.code == "E-CKPT-003" and "[3]" in caught.value.message


def test_keep_on_s3(s3):
    for step in range(1, 5):
        write(s3.uri("run"), step, keep=2)
    assert [s for s, _ in list_checkpoints(s3.uri("run"))] == [3, 4]
    assert s3.keys() == sorted(f"run/step-{s}/{name}" for s in (3, 4) for name in FILES)


def test_a_changed_object_is_found_by_its_digest(s3):
    path = write(s3.uri("run"), 1)
    key = "run/step-1/optimizer.safetensors"
    data = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    data[-1] ^= 0x80
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(data))
    with pytest.raises(SexpgpuError) as caught:
        read_checkpoint(path)
    assert caught.value.code == "E-CKPT-001"
    assert s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == bytes(data)


def test_a_different_checkpoint_at_the_same_step_is_not_overwritten(s3):
    path = write(s3.uri("run"), 1)
    before = s3.client.get_object(Bucket=s3.bucket, Key="run/step-1/model.safetensors")["ETag"]
    assert write(s3.uri("run"), 1) == path
    other = sample_tensors(1)
    other["param/encoder/w"][0, 0] += 1
    with pytest.raises(SexpgpuError) as caught:
        write_checkpoint(s3.uri("run"), 1, other, sample_record(1), bf16=BF16)
    assert caught.value.code == "E-CKPT-004"
    assert s3.client.get_object(Bucket=s3.bucket, Key="run/step-1/model.safetensors")["ETag"] == before


def truncate_object(s3, key):
    body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body[:-3])


DAMAGES = {
    "truncated": lambda s3: truncate_object(s3, "run/step-1/model.safetensors"),
    "missing": lambda s3: s3.client.delete_object(Bucket=s3.bucket, Key="run/step-1/optimizer.safetensors"),
    "unreadable record": lambda s3: s3.client.put_object(Bucket=s3.bucket, Key="run/step-1/COMMITTED", Body=b"{"),
}


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES)
def test_a_damaged_checkpoint_at_the_step_is_replaced_and_said_so(s3, damage):
    path = write(s3.uri("run"), 1)
    damage(s3)
    notes = []
    assert write(s3.uri("run"), 1, note=notes.append) == path
    assert verify_checkpoint(path).step == 1
    assert same_tensors(read_checkpoint(path).tensors, sample_tensors(1))
    assert s3.keys() == [f"run/step-1/{name}" for name in FILES]
    (line,) = notes
    assert path in line and "damaged" in line and "replaced" in line


def test_a_writer_clears_a_committed_checkpoint_only_when_told_to_replace_it(s3):
    write(s3.uri("run"), 1)
    before = s3.keys()
    with pytest.raises(SexpgpuError) as caught:
        s3_store.Writer(s3.uri("run"), 1)
    assert caught.value.code == "E-CKPT-004" and s3.keys() == before
    s3_store.Writer(s3.uri("run"), 1, replacing=True)
    assert s3.keys() == []


def test_a_damaged_checkpoint_is_uncommitted_before_it_is_rewritten(s3):
    root = s3.uri("run")
    write(root, 0)
    write(root, 1)
    truncate_object(s3, "run/step-1/model.safetensors")
    killed = checkpoint_child.run(root, 1, 1, env={"SEXPGPU_TEST_CHECKPOINT_KILL_AT": "file:model.safetensors"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # Its marker went first: what is left of step 1 is not a checkpoint, and latest is step 0.
    assert resolve_checkpoint("latest", root) == s3.uri("run/step-0")
    write(root, 1)
    assert same_tensors(read_checkpoint(resolve_checkpoint("latest", root)).tensors, sample_tensors(1))


@pytest.mark.parametrize("point", ["start", "mid:model.safetensors", "file:optimizer.safetensors", "commit"])
def test_sigkill_while_uploading_never_leaves_a_checkpoint_that_latest_takes(s3, monkeypatch, point):
    small_parts(monkeypatch)
    big = 11 * MIB if point.startswith("mid:") else 0  # a part boundary needs a multipart upload
    root = s3.uri("run")
    write(root, 1)
    killed = checkpoint_child.run(root, 2, 2, big_bytes=big, env={"SEXPGPU_TEST_CHECKPOINT_KILL_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert resolve_checkpoint("latest", root) == s3.uri("run/step-1")
    assert not any(key.endswith("step-2/COMMITTED") for key in s3.keys())
    write(root, 2, big_bytes=big)
    assert same_tensors(read_checkpoint(resolve_checkpoint("latest", root)).tensors, sample_tensors(2, big))


def test_uncommitted_leftovers_are_cleared_when_a_later_step_commits(s3):
    s3.client.put_object(Bucket=s3.bucket, Key="run/step-1/model.safetensors", Body=b"torn")
    write(s3.uri("run"), 2)
    assert s3.keys() == [f"run/step-2/{name}" for name in FILES]


def assert_no_secret(error: SexpgpuError) -> None:
    assert SECRET_KEY not in error.render() and SECRET_KEY not in str(error)


def test_an_unreachable_endpoint_is_E_S3_001(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    for attempt in (lambda: write(s3.uri("run"), 1), lambda: resolve_checkpoint("latest", s3.uri("run")),
                    lambda: read_checkpoint(s3.uri("run/step-1"))):
        with pytest.raises(SexpgpuError) as caught:
            attempt()
        assert caught.value.code == "E-S3-001" and "127.0.0.1" in caught.value.message
        assert_no_secret(caught.value)


def test_a_missing_bucket_is_E_S3_003(s3):
    for attempt in (lambda: write("s3://no-such-bucket-sexpgpu/run", 1),
                    lambda: resolve_checkpoint("latest", "s3://no-such-bucket-sexpgpu/run"),
                    lambda: read_checkpoint("s3://no-such-bucket-sexpgpu/run/step-1")):
        with pytest.raises(SexpgpuError) as caught:
            attempt()
        assert caught.value.code == "E-S3-003" and "no-such-bucket-sexpgpu" in caught.value.message
        assert_no_secret(caught.value)


def test_missing_credentials_are_E_S3_002(s3, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SexpgpuError) as caught:
        write(s3.uri("run"), 1)
    assert caught.value.code == "E-S3-002" and "credentials" in caught.value.message


@pytest.mark.parametrize("name, value, named", [
    ("AWS_ENDPOINT_URL", "notaurl", "Invalid endpoint: notaurl"),
    ("AWS_ENDPOINT_URL_S3", " ", "Invalid endpoint"),
    ("AWS_PROFILE", "no-such-profile", "no-such-profile"),
    ("AWS_CREDENTIAL_EXPIRATION", "-1", "TypeError"),  # not a date: fails when the credentials are first used
    ("AWS_SECRET_ACCESS_KEY", "", "missing: AWS_SECRET_ACCESS_KEY"),
    ("AWS_SESSION_TOKEN", "\u00e9", "session token holds a character that is not printable ASCII"),
    ("AWS_ACCESS_KEY_ID", "key\x7f", "access key id holds a character"),
])
def test_an_aws_configuration_that_sets_up_no_client_is_E_S3_005(s3, monkeypatch, name, value, named):
    """botocore refuses its configuration with exceptions of many kinds (ValueError, its own,
    dateutil's, TypeError): each is E-S3-005, before any request."""
    with monkeypatch.context() as patch:
        patch.setenv(name, value)
        for attempt in (lambda: write(s3.uri("run"), 1), lambda: resolve_checkpoint("latest", s3.uri("run"))):
            with pytest.raises(SexpgpuError) as caught:
                attempt()
            assert caught.value.code == "E-S3-005" and named in caught.value.message, caught.value.message
            assert_no_secret(caught.value)
    assert s3.keys() == []


def test_the_aws_retry_variables_are_not_read(s3, monkeypatch):
    """SEXPGPU_S3_ATTEMPTS bounds the attempts (docs/checkpoints.md): values botocore would refuse
    in AWS_MAX_ATTEMPTS and AWS_RETRY_MODE change nothing."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "many")
    monkeypatch.setenv("AWS_RETRY_MODE", "sometimes")
    path = write(s3.uri("run"), 1)
    assert resolve_checkpoint("latest", s3.uri("run")) == path


def test_an_endpoint_that_is_not_a_url_stops_the_command_with_status_2(s3, monkeypatch, capsys):
    from sexpgpu.cli.main import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", "notaurl")
    assert main(["checkpoint", s3.uri("run/step-1")]) == 2
    assert "error E-S3-005: the AWS configuration cannot set up an S3 client" in capsys.readouterr().err


@pytest.fixture
def forbidden_bucket(monkeypatch):
    """A server that checks credentials, a bucket, and a user whose keys may do nothing."""
    server = S3Server.start()
    try:
        admin = server.client()
        admin.create_bucket(Bucket="locked")
        iam = server.client("iam")
        iam.create_user(UserName="nobody")
        key = iam.create_access_key(UserName="nobody")["AccessKey"]
        server.require_authentication()
        for name, value in server.environment().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        yield "s3://locked", key["SecretAccessKey"]
    finally:
        server.stop()


def test_a_forbidden_bucket_is_E_S3_002_and_never_shows_the_secret(forbidden_bucket):
    root, secret = forbidden_bucket
    for attempt in (lambda: write(root + "/run", 1), lambda: resolve_checkpoint("latest", root + "/run"),
                    lambda: read_checkpoint(root + "/run/step-1")):
        with pytest.raises(SexpgpuError) as caught:
            attempt()
        assert caught.value.code == "E-S3-002" and "AccessDenied" in caught.value.message
        assert secret not in caught.value.render()


def test_the_record_on_s3_is_the_record_on_disk(s3, tmp_path):
    """The same checkpoint written to both places has the same experiment.json bytes."""
    write(s3.uri("run"), 5)
    write(str(tmp_path), 5)
    on_s3 = s3.client.get_object(Bucket=s3.bucket, Key="run/step-5/experiment.json")["Body"].read()
    assert on_s3 == (tmp_path / "step-5" / "experiment.json").read_bytes()
    assert json.loads(on_s3)["step"] == 5
