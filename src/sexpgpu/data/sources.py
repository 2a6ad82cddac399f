"""Data sources: each maps a global record index to a record, with no state.

The global record index of row i of microbatch m (0-based) of step s (1-based) is
((s - 1) * microbatches + m) * batch + i. Indices wrap at the end of the data; with
shuffling, epoch e reads the records in the order of a permutation drawn from the run's
seed and e.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sexpgpu import numerics as nx
from sexpgpu.data.corpus import CORPORA, corpus_bytes, corpus_digest
from sexpgpu.data.records import dtype_name, read_record_file
from sexpgpu.errors import SexpgpuError
from sexpgpu.store.digests import file_sha256

SHUFFLE_PATH = "data/shuffle"


@dataclass(frozen=True)
class FieldSpec:
    """One field of one record: its shape (without the batch axis) and dtype name."""

    shape: tuple[int, ...]
    dtype: str


class DataSource(ABC):
    """Records by global index. `fields` names each field's spec; `identity` describes the
    source for the report and checkpoints."""

    fields: dict[str, FieldSpec]
    identity: dict

    @abstractmethod
    def batch(self, start: int, count: int) -> dict[str, np.ndarray]:
        """Records start .. start+count-1, field by field, the batch axis first."""


def record_indices(start: int, count: int, total: int, shuffle_key=None) -> np.ndarray:
    """The record numbers of global indices start .. start+count-1."""
    global_index = np.arange(start, start + count, dtype=np.int64)
    local = global_index % total
    if shuffle_key is None:
        return local
    epochs = global_index // total
    result = np.empty(count, dtype=np.int64)
    for epoch in np.unique(epochs):
        chosen = epochs == epoch
        result[chosen] = _permutation(shuffle_key, int(epoch), total)[local[chosen]]
    return result


@lru_cache(maxsize=4)
def _permutation(key, epoch: int, total: int) -> np.ndarray:
    """A permutation of range(total): stable sort by 31-bit draws, ties broken by index.
    Cached: every step of an epoch reads the same one."""
    draws = nx.randint(nx.fold_in(key, epoch), (total,), 0, 2**31 - 1)
    permutation = np.argsort(draws, kind="stable")
    permutation.flags.writeable = False
    return permutation


class RecordSource(DataSource):
    def __init__(self, path: str, shuffle: bool, seed: int):
        self.path = path
        self.tensors = read_record_file(path)
        self.count = next(iter(self.tensors.values())).shape[0]
        self.shuffle_key = nx.stream_key(seed, SHUFFLE_PATH) if shuffle else None
        self.fields = {
            name: FieldSpec(tuple(array.shape[1:]), dtype_name(array)) for name, array in self.tensors.items()
        }
        sha256, size = file_sha256(path)
        # The path is for display: a resume compares the bytes and the digest (run/checkpointing.py).
        self.identity = {
            "kind": "records",
            "path": path,
            "records": self.count,
            "shuffle": shuffle,
            "bytes": size,
            "sha256": sha256,
        }

    def batch(self, start: int, count: int) -> dict[str, np.ndarray]:
        rows = record_indices(start, count, self.count, self.shuffle_key)
        return {name: array[rows] for name, array in self.tensors.items()}


class TextSource(DataSource):
    """Byte-level language modelling: x is `context` bytes, y the same bytes shifted by one."""

    def __init__(self, corpus: str, context: int):
        if corpus not in CORPORA:
            raise SexpgpuError("E-DATA-003", f"unknown corpus '{corpus}': expected one of {', '.join(CORPORA)}.")
        self.text = corpus_bytes(corpus)
        self.context = context
        self.starts = len(self.text) - context - 1
        if self.starts <= 0:
            raise SexpgpuError("E-DATA-003", f"a context of {context} bytes is longer than the corpus.")
        spec = FieldSpec((context,), "i32")
        self.fields = {"x": spec, "y": spec}
        self.identity = {
            "kind": "text",
            "corpus": corpus,
            "context": context,
            "bytes": int(len(self.text)),
            "sha256": corpus_digest(corpus),
        }

    def batch(self, start: int, count: int) -> dict[str, np.ndarray]:
        first = (np.arange(start, start + count, dtype=np.int64) * self.context) % self.starts
        window = first[:, None] + np.arange(self.context + 1, dtype=np.int64)[None, :]
        tokens = self.text[window].astype(np.int32)
        return {"x": np.ascontiguousarray(tokens[:, :-1]), "y": np.ascontiguousarray(tokens[:, 1:])}


def open_source(spec, seed: int) -> DataSource:
    """The source a `DataSpec` names; generators are opened by the run loop, which owns a backend."""
    if spec.kind == "records":
        return RecordSource(spec.path, spec.shuffle, seed)
    if spec.kind == "text":
        return TextSource(spec.corpus, spec.context)
    raise ValueError(f"open_source does not open {spec.kind} data")

