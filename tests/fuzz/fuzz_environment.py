"""Environment values: the fuzzer's settings inputs.

An environment case is tiny-adam, shrunk to two steps, checked and run with one variable set
to a value of one class: blank, whitespace, garbage, huge, negative, unicode, control
characters. The variables are every `SEXPGPU_*` setting in `settings.SETTINGS` and the AWS_*
values the S3 store reads (its own, the endpoint, and what boto3 builds its client from); a
case of an AWS_* or SEXPGPU_S3_* variable writes its checkpoints to the test S3 server. The
cases walk every (variable, class) pair in turn, so a run of as many cases as there are pairs
meets each one; the value within the class comes from the case's random stream.
"""

from __future__ import annotations

import random

from sexpgpu import settings

from fuzz_mutators import Case, Plan

SEED = "tiny-adam"
# The AWS configuration boto3 reads when the store makes its client, and the store's own
# (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_S3).
AWS_VARIABLES = (
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_CA_BUNDLE", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_USE_FIPS_ENDPOINT",
    "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT", "AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION",
    "AWS_DEFAULTS_MODE", "AWS_METADATA_SERVICE_TIMEOUT", "AWS_METADATA_SERVICE_NUM_ATTEMPTS",
    "AWS_EC2_METADATA_DISABLED", "AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE",
    "AWS_CREDENTIAL_EXPIRATION", "AWS_DISABLE_REQUEST_COMPRESSION", "AWS_REQUEST_MIN_COMPRESSION_SIZE_BYTES",
    "AWS_ACCOUNT_ID", "AWS_ACCOUNT_ID_ENDPOINT_MODE", "AWS_SDK_UA_APP_ID", "AWS_DATA_PATH",
)

# No NUL: no environment can hold one. "\udcff" is the byte 0xff, which is not UTF-8.
VALUE_CLASSES = {
    "blank": ("",),
    "whitespace": (" ", "\t", "  \n ", "\u00a0", "\u3000", " \r\n"),
    "garbage": ("abc", "on off", "0x10", "1.5.5", "nan", "inf", "s3://", "s3:///x", "file://", "-", "=", "'1'",
                "\"on\"", "yes", "null", "http://", "http://[::1", "ftp://x", "1e", "1_000_"),
    "huge": ("9" * 40, str(2**64), "1e999", "9" * 5000, "1" + "0" * 400, "x" * 100_000),
    "negative": ("-1", "-0", "-1e9", str(-2**63), "-inf", "-0.5"),
    "unicode": ("ｏｎ", "１", "on\u200b", "é", "😀", "\u202eon", "١", "\udcff", "隠れ"),
    "control": ("\x1b[31m", "on\x07", "\x01", "\x7f", "0\r", "\x9b", "\x1b]0;title\x07", "\b\b"),
}


def variables() -> tuple[str, ...]:
    return (*sorted(settings.SETTINGS), *AWS_VARIABLES)


def pairs() -> tuple[tuple[str, str], ...]:
    """Every (variable, value class), in the order the cases walk them."""
    return tuple((name, kind) for name in variables() for kind in VALUE_CLASSES)


def uses_s3(name: str) -> bool:
    """Whether the variable is read only on the way to S3, so that its case writes there."""
    return name.startswith(("AWS_", "SEXPGPU_S3_"))


def make_environment_case(index: int, seeds, runnable, plan: Plan = Plan()) -> Case:
    """Case `index` of the environment kind: the index's pair, a value of its class."""
    walked = pairs()
    name, kind = walked[index % len(walked)]
    value = random.Random(f"{plan.seed}:environment:{index}").choice(VALUE_CLASSES[kind])
    seed = next(s for s in runnable if s.name == SEED)
    # one checkpoint, at the last step: it passes every crash point, and on S3 every kind of request
    text = seed.text.replace(":checkpoint 1", ":checkpoint 2")
    return Case(index, "run", SEED, (f"{name}={kind}",), text, environ=((name, value),), s3=uses_s3(name))
