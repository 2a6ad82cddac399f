"""SHA-256 digests that overlap with the I/O producing or consuming the bytes."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor

CHUNK_BYTES = 32 * 1024 * 1024


class BackgroundSha256:
    """A SHA-256 fed on one worker thread, in submission order.

    hashlib releases the GIL on large buffers, so hashing one chunk runs while the caller
    writes or reads the next. A submitted buffer must not change until `hexdigest` returns.
    """

    def __init__(self):
        self._hash = hashlib.sha256()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        self._pending: list[Future] = []

    def update(self, data) -> None:
        # At most two chunks wait, which bounds the memory a fast reader holds.
        while len(self._pending) >= 2:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._hash.update, data))

    def hexdigest(self) -> str:
        try:
            for future in self._pending:
                future.result()
            return self._hash.hexdigest()
        finally:
            self._pool.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def chunks(buffers, size: int = CHUNK_BYTES):
    """The buffers' bytes, in order, as memoryviews of at most `size` bytes (no copies)."""
    for buffer in buffers:
        view = memoryview(buffer).cast("B")
        for start in range(0, len(view), size):
            yield view[start : start + size]


def sha256_of(data) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str) -> tuple[str, int]:
    """The SHA-256 and size of a local file, reading it in chunks."""
    total = 0
    with open(path, "rb", buffering=0) as file, BackgroundSha256() as digest:
        size = os.fstat(file.fileno()).st_size
        while True:
            # no larger than what is left (and a byte, to see the end): a whole chunk zeroed
            # for a small file took longer than hashing it
            block = bytearray(min(CHUNK_BYTES, max(size - total, 0) + 1))
            count = file.readinto(block)
            if not count:
                return digest.hexdigest(), total
            digest.update(memoryview(block)[:count])
            total += count
