"""Checkpoints on a local disk or S3, and the weight files that `:load` parameters start from.

Writing is atomic (a temporary directory renamed into place, or a commit marker uploaded
last), reading verifies every file's SHA-256, and a resume finds the newest committed
checkpoint. See docs/checkpoints.md for the layout and the rules.
"""

from sexpgpu.store.checkpoints import (
    Checkpoint,
    Verified,
    check_tensors,
    format_verified,
    list_checkpoints,
    read_checkpoint,
    read_record,
    recorded_pins,
    resolve_checkpoint,
    uncommitted_after,
    verify_checkpoint,
    write_checkpoint,
)
from sexpgpu.store.checks import TensorSpec
from sexpgpu.store.describe import describe_checkpoint, format_checkpoint
from sexpgpu.store.identity import BIT_KEYS, check_same_experiment
from sexpgpu.store.loads import LoadPin, load_parameter, verify_load_pin
from sexpgpu.store.s3_objects import TransferSettings
from sexpgpu.store.s3_waits import lines_to as s3_waiting_lines_to
