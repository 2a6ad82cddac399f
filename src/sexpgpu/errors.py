"""The one error type users see.

Every bad input (a file, a flag, a checkpoint, a tensor) becomes a `SexpgpuError`: a code
listed in docs/errors.md, a one-paragraph message, and where it applies the file, line and
column. The command line prints it and exits with status 2; nothing else reaches the user
as a traceback.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """A place in an experiment file. Lines and columns count from 1."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class SexpgpuError(Exception):
    """A user-facing error: `code` names the rule broken, `message` says what was expected."""

    def __init__(self, code: str, message: str, location: Location | None = None, hint: str | None = None):
        self.code = code
        self.message = redact(message)
        self.location = location
        self.hint = redact(hint) if hint else hint
        super().__init__(self.render())

    def render(self) -> str:
        """One line for a terminal. Names and strings quoted from a file may hold control
        characters, shown escaped (`\\x1b`), never sent to the terminal; and may be of any
        length, so a run of more than LONG_WORD characters without a space is shortened."""
        where = f"{self.location}: " if self.location else ""
        text = f"{where}error {self.code}: {self.message}"
        if self.hint:
            text += f" {self.hint}"
        return _LONG_WORD.sub(_shortened, escape_controls(text))


# C0 and C1 controls, DEL, and the bidirectional overrides that reorder what a terminal shows.
_CONTROLS = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)]}
_CONTROLS.update({code: f"\\u{code:04x}" for code in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]})


LONG_WORD = 200
_LONG_WORD = re.compile(r"\S{%d,}" % (LONG_WORD + 1))


def _shortened(match) -> str:
    word = match.group(0)
    return f"{word[:80]}...({len(word):,} characters)"


def escape_controls(text: str) -> str:
    """`text` with every control character written as an escape."""
    return text.translate(_CONTROLS)


# "Did you mean" compares at most this many characters and this many candidates, so that
# its cost is bounded whatever the names in a file: longer names get no suggestion.
SUGGEST_MAX_LENGTH = 64
SUGGEST_MAX_CANDIDATES = 2000


def nearest_name(name: str, candidates) -> str | None:
    """The candidate closest to `name` by edit distance, if it is close enough to suggest."""
    if len(name) > SUGGEST_MAX_LENGTH:
        return None
    allowed = max(2, len(name) // 3)
    near_in_length = [c for c in sorted(candidates) if abs(len(c) - len(name)) <= allowed]
    best, best_distance = None, allowed + 1
    for candidate in near_in_length[:SUGGEST_MAX_CANDIDATES]:
        distance = _edit_distance(name, candidate, best_distance - 1)
        if distance < best_distance:
            best, best_distance = candidate, distance
    return best


def did_you_mean(name: str, candidates, sigil: str = "") -> str | None:
    """The hint naming the nearest candidate, written after `sigil` (":" for a keyword)."""
    suggestion = nearest_name(name, candidates)
    return f"Did you mean '{sigil}{suggestion}'?" if suggestion else None


def _edit_distance(a: str, b: str, limit: int) -> int:
    """The Levenshtein distance of `a` and `b`, or `limit + 1` once it must exceed `limit`."""
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]


# `scheme://user:password@host`: everything between the scheme and the @ is a credential.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"]+@")
# Environment variables whose values are secrets wherever they turn up; a name ending in
# _FILE, _PATH or _DIR holds where a secret is (AWS_WEB_IDENTITY_TOKEN_FILE), not the secret.
_SECRET_VARIABLE = re.compile(r"^(?!.*_(FILE|PATH|DIR)$).*(SECRET|TOKEN|PASSWORD|PASSWD)|^AWS_ACCESS_KEY_ID$")
_SHORTEST_SECRET = 4  # shorter values would blank out ordinary words


def redact(text: str) -> str:
    """`text` without credentials: the user part of every URL, and the value of every secret
    environment variable (AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, ...), become ***.

    Every SexpgpuError passes its message and hint through here, so an endpoint such as
    http://KEY:SECRET@host or a server's reply that quotes a key never reaches the user."""
    text = _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)
    for name, value in sorted(os.environ.items()):
        if _SECRET_VARIABLE.search(name) and len(value) >= _SHORTEST_SECRET:
            text = text.replace(value, "***")
    return text
