"""Where a checkpoint or a weight file lives: a local path or an s3://bucket/key URI."""

from __future__ import annotations

import os

from sexpgpu.errors import SexpgpuError

S3_SCHEME = "s3://"


class MissingFile(Exception):
    """A file or object that is not there; callers say what was missing and why it matters."""


def is_s3(path: str) -> bool:
    return str(path).startswith(S3_SCHEME)


def split_s3(uri: str) -> tuple[str, str]:
    """("bucket", "key/with/slashes") from "s3://bucket/key/with/slashes"."""
    bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise SexpgpuError("E-S3-004", f"'{uri}' names no bucket; write s3://BUCKET/PREFIX.")
    return bucket, key


def join(base: str, *names: str) -> str:
    """`base` / names, for a directory or an S3 prefix alike."""
    if is_s3(base):
        return "/".join([base.rstrip("/"), *names])
    return os.path.join(base, *names)


def parent(path: str) -> str:
    """The directory or prefix holding `path`."""
    if is_s3(path):
        bucket, key = split_s3(path.rstrip("/"))
        return f"{S3_SCHEME}{bucket}/{key.rsplit('/', 1)[0]}" if "/" in key else f"{S3_SCHEME}{bucket}"
    return os.path.dirname(os.path.abspath(path))


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if is_s3(path) else os.path.basename(os.path.normpath(path))
