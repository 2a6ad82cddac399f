"""The built-in byte-level text corpus: CPython's own `pydoc_data.topics`.

Every Python install ships it, so a char-level language model needs no download. Its text
differs between Python versions; the run records the corpus digest so a comparison of two
runs can tell.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

CORPORA = ("pydoc",)


@lru_cache(maxsize=None)
def corpus_bytes(name: str) -> np.ndarray:
    """The corpus as uint8, topics joined in sorted key order (a fixed, documented order)."""
    if name != "pydoc":
        raise KeyError(name)
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics)).encode("utf-8")
    return np.frombuffer(text, dtype=np.uint8)


def corpus_digest(name: str) -> str:
    return hashlib.sha256(corpus_bytes(name).tobytes()).hexdigest()
