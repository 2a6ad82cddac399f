"""Where a machine remembers its choices: `~/.cache/sexpgpu`.

    choices.json                                  {"format": 1, "entries": {digest: entry}}
    cost/<gpu>-<identity-hash>-<driver>.json      the same shape, for the cost model's numbers

An entry is {"identity": ..., "key": ..., "value": ...} under the SHA-256 of its identity and
key. The identity is everything that can make one measurement differ from another on the same
card (determinism.md, "What a run chooses"): the GPU, the CUDA driver API version, the loaded
libraries, the executable's size and modification time, and the hashes of the training graph
and any generator's graphs; the key adds the decision and its candidates (the stacking
degrees that fit, the product shapes). A convolution's engine ("engines", kept in
choices.json too) is a measurement of one convolution on one card, so its identity is only
the GPU, the CUDA driver API version and its library's version (cuDNN's), and its key the role, shape and
dtype: another model, or another build of sexpgpu, meets the same convolution again
without timing it.

Files are written whole to a temporary file and renamed into place, so a reader sees the old
file or the new one. A writer holds an advisory lock while it reads the file
afresh and adds its entry, and the first entry for a key stays: two runs that measure the same
thing at once both take the first one remembered (`.lock` in the cache directory), so they and every later run agree
(sexpgpu/files.py). A file that cannot be read as this shape is ignored, and the run says
so; an unset HOME or a cache that cannot be written is said too, and the run goes on: it only
loses level 1 against a later run, whose measurement may choose otherwise. `ChoiceCache.forgets`
says why, and the determinism line says so (plan/levels.py) instead of naming the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field

from sexpgpu.files import locked, write_atomically
from sexpgpu.plan.device import DeviceFacts

FORMAT = 1
LOCK_NAME = ".lock"  # the writers' advisory lock, in the cache directory
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


HOME_UNSET = "HOME is unset, so there is no ~/.cache/sexpgpu"


def cache_root() -> str | None:
    """~/.cache/sexpgpu, or None when HOME is unset (determinism.md: the run then says so)."""
    home = os.environ.get("HOME")
    return os.path.join(home, ".cache", "sexpgpu") if home else None


def cache_forgets() -> str:
    """Why a run here would not remember what it measures, as far as can be told without
    writing: HOME unset, or the cache (or the nearest folder above it that exists) not a folder
    this process may write; '' when it would. A run says what actually happened
    (`ChoiceCache.forgets`): a cache it cannot write costs nothing when every choice is in it."""
    root = cache_root()
    if root is None:
        return HOME_UNSET
    existing = root
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not (os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK)):
        return f"{root} cannot be written"
    return ""


def graph_hash(graphs) -> str:
    """A stable hash of graphs: the SHA-256 of their node listings (`Graph.dump`), in order."""
    digest = hashlib.sha256()
    for graph in graphs:
        digest.update((graph.dump() if graph is not None else "none").encode())
        digest.update(b"\n--\n")
    return digest.hexdigest()


def executable_identity(path: str | None = None) -> dict:
    path = path or sys.executable
    try:
        found = os.stat(path)
    except OSError:
        return {"path": path, "size": None, "mtime_ns": None}
    return {"path": path, "size": found.st_size, "mtime_ns": found.st_mtime_ns}


def identity(facts: DeviceFacts, training, generators=()) -> dict:
    return {
        "gpu": facts.gpu,
        "driver": facts.driver,
        "libraries": dict(sorted(facts.libraries.items())),
        "patterns": list(facts.patterns),  # another set of pattern graphs lowers the graphs otherwise
        "executable": executable_identity(),
        "training": graph_hash([training.micro, training.update]),
        "generators": graph_hash(generators) if generators else None,
    }


def engine_identity(facts: DeviceFacts) -> dict:
    """What a convolution engine's timing depends on besides the convolution itself."""
    return {"gpu": facts.gpu, "driver": facts.driver, facts.engine_library: facts.libraries.get(facts.engine_library)}


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclass
class ChoiceCache:
    """The plan's memory (the methods of plan/choices.py's `Forgetful`), in the two cache files."""

    root: str | None
    identity: dict
    engines_identity: dict | None = None  # the identity of the "engines" entries; None: `identity`
    notes: list = field(default_factory=list)
    taken: list = field(default_factory=list)  # the keys found in the cache
    made: list = field(default_factory=list)  # the keys chosen now (measured, or a fixed value)
    forgets: str = ""  # why something chosen now is not remembered (HOME unset, a failed write); '' when all is
    _files: dict = field(default_factory=dict)

    def path(self, file: str) -> str:
        if file in ("choices", "engines"):
            return os.path.join(self.root, "choices.json")
        device = f"{self.identity['gpu']}-{_digest(self.identity)[:16]}-{self.identity['driver']}"
        return os.path.join(self.root, "cost", _UNSAFE.sub("_", device) + ".json")

    def lookup(self, file: str, key: str):
        if self.root is None:
            return None
        entry = self._entries(file).get(_digest([self._identity(file), key]))
        value = entry.get("value") if isinstance(entry, dict) and entry.get("key") == key else None
        if value is not None:
            self.taken.append(key)
        return value

    def remember(self, file: str, key: str, value, acceptable=lambda value: True):
        """Remember value under key and return the value in effect: the one another run on
        this machine remembered first, if `acceptable` takes it, else this one."""
        self.made.append(key)
        if self.root is None:
            return value
        digest = _digest([self._identity(file), key])
        try:
            with locked(os.path.join(self.root, LOCK_NAME)):
                entries = self._files[file] = self._read(self.path(file))
                earlier = entries.get(digest)
                if isinstance(earlier, dict) and earlier.get("key") == key and earlier.get("value") is not None \
                        and acceptable(earlier["value"]):
                    if earlier["value"] != value:
                        self._note(f"{key.split('/')[0]}: another run on this machine remembered its choice first, "
                                   "and this run takes it")
                    return earlier["value"]
                entries[digest] = {"identity": self._identity(file), "key": key, "value": value}
                write_atomically(self.path(file), json.dumps({"format": FORMAT, "entries": entries}, indent=1,
                                                             sort_keys=True) + "\n")
        except OSError as error:
            self.forgets = f"the cache {self.path(file)} cannot be written"
            self._note(f"{self.forgets} ({error.strerror or error}): nothing measured now is remembered")
        return value

    def _identity(self, file: str) -> dict:
        return self.engines_identity if file == "engines" and self.engines_identity is not None else self.identity

    def _entries(self, file: str) -> dict:
        if file not in self._files:
            self._files[file] = self._read(self.path(file))
        return self._files[file]

    def _read(self, path: str) -> dict:
        try:
            with open(path, encoding="utf-8") as handle:
                content = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, ValueError) as error:
            self._note(f"the cache {path} could not be read ({type(error).__name__}) and is ignored")
            return {}
        if not isinstance(content, dict) or content.get("format") != FORMAT or not isinstance(content.get("entries"), dict):
            self._note(f"the cache {path} is not a sexpgpu cache of format {FORMAT} and is ignored")
            return {}
        return content["entries"]

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def open_cache(facts: DeviceFacts, training, generators=()) -> ChoiceCache:
    root = cache_root()
    cache = ChoiceCache(root, identity(facts, training, generators), engine_identity(facts))
    if root is None:
        cache.forgets = HOME_UNSET
        cache.notes.append(f"{HOME_UNSET}: every choice is measured now and nothing is remembered")
    return cache
