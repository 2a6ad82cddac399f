"""S3 objects through boto3, with S3's failures turned into error codes.

The client follows the standard AWS configuration: credentials and region from the
environment, ~/.aws or an instance role, and `AWS_ENDPOINT_URL` for an S3-compatible store.
Messages name buckets and keys, never credentials: SexpgpuError redacts every message
(`errors.redact`), the endpoint's user part and any secret the environment holds included.

Large objects go up as multipart uploads and come down as parallel ranged reads. Parts are
`TransferSettings.part_size` bytes (S3 takes at least 5 MiB for every part but the last).

Every request goes through `_request`, which bounds its wait and says what it waits for
(s3_waits.py): an endpoint that stops answering stops the command with E-S3-001, never
silently holds it.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from sexpgpu import settings as transfer_settings
from sexpgpu.errors import SexpgpuError
from sexpgpu.store.digests import BackgroundSha256, chunks, sha256_of
from sexpgpu.store.s3_waits import Patience, Stalled, answer
from sexpgpu.store.uris import MissingFile, split_s3

MIB = 1024 * 1024
_FORBIDDEN = {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
              "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "403", "Forbidden"}
_MISSING = {"NoSuchKey", "404", "NotFound"}


@dataclass(frozen=True)
class TransferSettings:
    """How objects are split. The environment can set each: SEXPGPU_S3_MULTIPART_THRESHOLD,
    SEXPGPU_S3_PART_SIZE (bytes) and SEXPGPU_S3_WORKERS."""

    multipart_threshold: int = 64 * MIB
    part_size: int = 64 * MIB
    workers: int = 4

    @classmethod
    def from_env(cls) -> "TransferSettings":
        default = cls()
        return cls(
            transfer_settings.value("SEXPGPU_S3_MULTIPART_THRESHOLD") or default.multipart_threshold,
            transfer_settings.value("SEXPGPU_S3_PART_SIZE") or default.part_size,
            transfer_settings.value("SEXPGPU_S3_WORKERS") or default.workers,
        )


class ObjectChanged(Exception):
    """An If-Match precondition failed: the object was replaced while we read it."""


# The client of the AWS environment last asked for, and botocore's loader of its data files
# (the S3 model, the endpoint rules) for the search path last asked for: one each, as each
# holds megabytes, and a process that moves between environments (a test suite, the fuzzer)
# would otherwise keep one for each. The loader is shared by the clients made for other
# environments: loading its files again took most of the time of making one.
_clients: dict[tuple, object] = {}
_loaders: dict[object, object] = {}


def client(patience: Patience | None = None):
    """A boto3 S3 client for the current AWS environment and the request bounds (s3_waits.py),
    made again when either changes."""
    patience = patience or Patience.from_env()
    key = (tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))), patience)
    return _latest(_clients, key, lambda: _new_client(patience))


def _latest(cache: dict, key, make):
    """cache[key], made if need be, and kept alone. Another thread may make it too: each
    returns its own, never a KeyError."""
    found = cache.get(key)
    if found is None:
        found = make()
        cache.clear()
        cache[key] = found
    return found


def _new_client(patience: Patience):
    """A client, its credentials resolved now: E-S3-005 when the AWS configuration (the AWS_*
    variables, ~/.aws/config and credentials) cannot make one.

    botocore checks that configuration as it builds a client and its credentials, and says what
    is wrong with whatever exception its parser of the moment raises: ValueError for an endpoint
    that is not a URL or a count that is not a number, dateutil's ParserError or OverflowError
    for a credential expiry, its own BotoCoreError subclasses for the rest. All of them come from
    the configuration, so all are caught here. Credentials are resolved here too, where an
    expiry that is not a date fails, rather than at the first request; none found at all is
    left to the request (E-S3-002)."""
    import boto3
    import botocore.loaders
    import botocore.session
    from botocore.config import Config

    try:
        core = botocore.session.Session()
        path = core.get_config_variable("data_path")
        core.register_component("data_loader", _latest(_loaders, path, lambda: botocore.loaders.create_loader(path)))
        session = boto3.session.Session(botocore_session=core)
        made = session.client("s3", config=Config(**patience.client_config()))
        credentials = session.get_credentials()
        if credentials is not None:
            _check_header_text(credentials.get_frozen_credentials())
    except Exception as error:  # noqa: BLE001 - see above: every kind here is a configuration error
        raise SexpgpuError("E-S3-005", f"the AWS configuration cannot set up an S3 client: {type(error).__name__}: "
                                       f"{error}.",
                           hint="Check the AWS_* variables (AWS_ENDPOINT_URL is a URL such as http://host:9000), "
                                "AWS_PROFILE and the files in ~/.aws.") from None
    return made


def _check_header_text(frozen) -> None:
    """Credentials travel in HTTP headers and signatures: a character that is not printable
    ASCII (the fuzzer's AWS_SESSION_TOKEN=é) failed deep in http.client, at the first request."""
    parts = {"access key id": frozen.access_key, "secret access key": frozen.secret_key, "session token": frozen.token}
    for label, text in parts.items():
        if text and not (text.isascii() and text.isprintable()):
            raise ValueError(f"the {label} holds a character that is not printable ASCII")


def _request(uri: str, doing: str, call, part: str = ""):
    """call(client) as one S3 request about `uri`: its wait bounded, its errors coded. `part`
    (" (part 3 of 5)") says which piece of the object the request moves."""
    patience = Patience.from_env()
    s3 = client(patience)
    with s3_errors(uri, doing, part):
        return answer(lambda: call(s3), _endpoint(), f"{doing} {uri}{part}", patience)


def unreachable(error: BaseException) -> bool:
    """Whether `error` says the endpoint did not answer: a clean-up request would wait as long."""
    return isinstance(error, SexpgpuError) and error.code == "E-S3-001"


@contextmanager
def s3_errors(uri: str, doing: str, part: str = ""):
    """Turn botocore's exceptions about `uri` into SexpgpuError, MissingFile or ObjectChanged."""
    import botocore.exceptions as bx

    started = time.monotonic()
    try:
        yield
    except bx.NoCredentialsError:
        raise SexpgpuError("E-S3-002", f"no AWS credentials were found for {doing} {uri}.",
                           hint="Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role.") from None
    except (Stalled, bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError,
            bx.ConnectionClosedError) as error:
        raise SexpgpuError("E-S3-001", f"cannot reach the S3 endpoint {_endpoint()} for {doing} {uri}{part}: "
                           f"{str(error)}; waited {time.monotonic() - started:.1f} s.",
                           hint="Check AWS_ENDPOINT_URL, the network, and that the store is running. "
                                "SEXPGPU_S3_TIMEOUT sets how long a request may wait (docs/settings.md).") from None
    except bx.ClientError as error:
        _raise_client_error(error, uri, doing)
    except bx.BotoCoreError as error:
        raise SexpgpuError("E-S3-004", f"S3 request for {doing} {uri} failed: {str(error)}") from None


def _raise_client_error(error, uri: str, doing: str):
    info = error.response.get("Error", {})
    code = str(info.get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    bucket = split_s3(uri)[0]
    if code == "NoSuchBucket":
        raise SexpgpuError("E-S3-003", f"there is no bucket '{bucket}' ({doing} {uri}).",
                           hint="Create it, or check the bucket name and AWS_ENDPOINT_URL.") from None
    if code in _FORBIDDEN or status == 403:
        raise SexpgpuError("E-S3-002", f"S3 refused {doing} {uri}: {code} (HTTP {status}).",
                           hint="The credentials in use lack permission for this bucket or prefix.") from None
    if code in _MISSING:
        raise MissingFile(uri) from None
    if code == "PreconditionFailed" or status == 412:
        raise ObjectChanged(uri) from None
    message = str(info.get("Message", ""))
    raise SexpgpuError("E-S3-004", f"S3 refused {doing} {uri}: {code} (HTTP {status}) {message}".rstrip()) from None


def _endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "(the AWS default)"


def get_bytes(uri: str, doing: str) -> bytes:
    """A small object's whole content."""
    bucket, key = split_s3(uri)
    return _request(uri, doing, lambda s3: s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def get_range(uri: str, start: int, stop: int, doing: str, etag: str | None = None,
              part: str = "") -> tuple[bytes, int, str]:
    """Bytes [start, stop) of an object, its total size and its ETag.

    With `etag`, raises ObjectChanged if the object is no longer that version.
    """
    bucket, key = split_s3(uri)
    extra = {"IfMatch": etag} if etag else {}

    def head(s3):
        found = s3.head_object(Bucket=bucket, Key=key, **extra)
        return b"", found["ContentLength"], found["ETag"]

    def read(s3):
        if stop <= start:
            return head(s3)
        try:
            reply = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}", **extra)
        except Exception as error:
            if _code(error) != "InvalidRange":
                raise
            return head(s3)
        total = int(reply["ContentRange"].rsplit("/", 1)[1]) if "ContentRange" in reply else reply["ContentLength"]
        return reply["Body"].read(), total, reply["ETag"]

    return _request(uri, doing, read, part)


def _code(error) -> str:
    return str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))


def get_object(uri: str, doing: str, settings: TransferSettings) -> tuple[bytearray, str, str]:
    """An object's content in a new bytearray, its ETag and its SHA-256.

    Large objects are read as parallel ranges pinned to one version by If-Match.
    """
    first, total, etag = get_range(uri, 0, settings.part_size, doing)
    data = bytearray(total)
    data[: len(first)] = first
    ranges = [(s, min(s + settings.part_size, total)) for s in range(len(first), total, settings.part_size)]

    def fetch(numbered):
        number, (start, stop) = numbered
        part, _, _ = get_range(uri, start, stop, doing, etag, f" (part {number} of {len(ranges) + 1})")
        data[start:stop] = part

    try:
        with ThreadPoolExecutor(max_workers=settings.workers) as pool:
            list(pool.map(fetch, enumerate(ranges, 2)))
    except ObjectChanged:
        raise SexpgpuError("E-S3-004", f"{uri} was replaced while it was being read; read it again.") from None
    if len(data) != total:
        raise SexpgpuError("E-S3-004", f"{uri} came back with {len(data)} bytes instead of {total}.")
    return data, etag, sha256_of(data)


def put_object(uri: str, buffers, nbytes: int, doing: str, settings: TransferSettings, on_part=None) -> tuple[str, str]:
    """Upload the concatenated buffers as one object; returns its ETag and the bytes' SHA-256.

    At or above the multipart threshold the upload is multipart, and is aborted if any part
    fails, so a failed upload leaves no object behind. `on_part(count)` runs after each part.
    """
    if nbytes < settings.multipart_threshold:
        body = b"".join(bytes(b) for b in buffers)
        bucket, key = split_s3(uri)
        reply = _request(uri, doing, lambda s3: s3.put_object(Bucket=bucket, Key=key, Body=body))
        return reply["ETag"], sha256_of(body)
    transfer_settings.check_part_count(nbytes, settings.part_size)
    return _put_multipart(uri, buffers, -(-nbytes // settings.part_size), doing, settings, on_part)


def _put_multipart(uri, buffers, count, doing, settings, on_part) -> tuple[str, str]:
    bucket, key = split_s3(uri)
    upload_id = _request(uri, doing, lambda s3: s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
    try:
        etags, digest = _upload_parts(uri, buffers, count, doing, settings, upload_id, on_part)
        parts = {"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, 1)]}
        reply = _request(uri, doing, lambda s3: s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload=parts))
        return reply["ETag"], digest
    except BaseException as error:
        if not unreachable(error):
            _abort_quietly(uri, upload_id)
        raise


def _upload_parts(uri, buffers, count, doing, settings, upload_id, on_part):
    bucket, key = split_s3(uri)

    def upload(number_and_body):
        number, body = number_and_body
        return _request(uri, doing, lambda s3: s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)["ETag"],
            f" (part {number} of {count})")

    with BackgroundSha256() as digest, ThreadPoolExecutor(max_workers=settings.workers) as pool:
        futures = []
        try:
            for number, body in enumerate(_parts(buffers, settings.part_size), 1):
                digest.update(body)
                # Hold at most twice the workers' parts in memory.
                while sum(not f.done() for f in futures) >= 2 * settings.workers:
                    next(f for f in futures if not f.done()).result()
                futures.append(pool.submit(upload, (number, body)))
            etags = []
            for done, future in enumerate(futures, 1):
                etags.append(future.result())
                if on_part:
                    on_part(done)
        except BaseException:
            for future in futures:  # the parts not yet started: the upload is given up
                future.cancel()
            raise
        return etags, digest.hexdigest()


def _parts(buffers, part_size: int):
    """The buffers' bytes as `part_size` pieces (the last may be shorter)."""
    pending, pending_bytes = [], 0
    for piece in chunks(buffers, part_size):
        while piece:
            take = piece[: part_size - pending_bytes]
            pending.append(take)
            pending_bytes += len(take)
            piece = piece[len(take) :]
            if pending_bytes == part_size:
                yield b"".join(pending)
                pending, pending_bytes = [], 0
    if pending_bytes:
        yield b"".join(pending)


def _abort_quietly(uri: str, upload_id: str) -> None:
    bucket, key = split_s3(uri)
    try:
        _request(uri, "abandoning the upload of", lambda s3: s3.abort_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id))
    except Exception:
        pass  # The upload is never completed either way; S3 lifecycle rules reclaim its parts.


def list_keys(prefix_uri: str, doing: str) -> list[str]:
    """Every key under a prefix, as s3:// URIs, sorted."""
    bucket, prefix = split_s3(prefix_uri)
    keys = []
    pages = None

    def next_page(s3):
        nonlocal pages
        pages = pages or iter(s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix))
        return next(pages, None)  # each page one request, each bounded

    while (page := _request(prefix_uri, doing, next_page)) is not None:
        keys += [f"s3://{bucket}/{item['Key']}" for item in page.get("Contents", [])]
    return sorted(keys)


def delete_keys(uris: list[str], doing: str) -> None:
    """Delete objects, in the order given (callers put a commit marker first)."""
    for uri in uris:
        bucket, key = split_s3(uri)
        _request(uri, doing, lambda s3: s3.delete_object(Bucket=bucket, Key=key))
