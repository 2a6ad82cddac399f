"""Seeded mutations of experiment files: the fuzzer's inputs.

A case is a seed file (an example or a file of the malformed corpus) with one to three
mutations applied. Each mutation is a named function `(rng, text) -> text` in a table; the
families are bytes, tokens, numbers, nesting, names, sizes, strings and splices. Text is held as
`str` decoded with surrogateescape, so that a byte mutation may leave bytes that are not UTF-8
and they survive the round trip to the file.

Everything is a function of (seed, case index): case 4711 is the same file on every machine,
so a failure is reproduced by its index alone.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
MALFORMED = REPO / "tests" / "malformed"

# Example seeds whose `run` with two steps takes well under a second on the CPU; char-lm takes
# seconds a step and is fuzzed with `check` only.
RUNNABLE = ("tiny-adam", "teacher-student", "cnn")

_TOKEN = re.compile(r'\(|\)|"(?:[^"\\]|\\.)*"?|;[^\n]*|[^\s()";]+|\s+', re.S)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_SYMBOL = re.compile(r"[A-Za-z_*+\-/<>=!?&%.$^~][\w*+\-/<>=!?&%.$^~]*$")


def _digits(count: int, lead: str = "7") -> str:
    return lead + "3" * (count - 1)


# Numbers at the edges: of int64/uint64, of float64, of Python's int-to-str limit (4,300 digits),
# and malformed ones. Every mutation of a number draws from here.
NUMBERS = (
    "0", "-0", "1", "-1", "2", "3", "7", "0.0", "-0.0", "0.5", "1.5", "-2.5", "64.0", "1e-3",
    "1e308", "1e309", "-1e309", "1e-400", "4.9e-324", "1e20", "1e12",
    "1000", "65536", "1000000", "1000000000000", "100000000000000000000",
    str(2**31 - 1), str(2**31), str(2**32), str(2**53 + 1), str(2**63 - 1), str(2**63), str(-2**63),
    str(-2**63 - 1), str(2**64 - 1), str(2**64), str(2**70), str(10**20),
    _digits(309), _digits(310), "0." + _digits(400), _digits(4300), _digits(4301), _digits(4400),
    "-" + _digits(4400), _digits(4400) + ".5", "1" + "0" * 400 + ".0", "1e" + _digits(400),
    "+5", "00012", "1.", ".5", "1e", "1e-3.5", "--1", "0x10", "1_000", "10k", "nan", "inf", "-inf",
    "１２",
)

# Sizes: counts and dimensions, small, at the type edges, and huge.
SIZES = (
    "0", "-1", "1", "2", "3", "5", "1000", "100000", "1000000", str(2**31), str(2**32), str(2**53),
    str(2**62), str(2**63 - 1), str(2**63), str(2**64), str(2**70), "1000000000000",
    "100000000000000000000", _digits(4400), "1.5", "64.0", "-0", str(-2**63),
)
# Sizes a two-step `run` may meet: small ones, which run fast, and ones beyond any range `check`
# can admit, which must be refused before a step. The middle (a :batch of a million) is only
# checked: running it is slow by right, not a hang.
RUN_SIZES = ("0", "-1", "1", "2", "3", "5", "1.5", "-0", str(2**62), str(2**63), str(2**64),
             str(2**70), "100000000000000000000", _digits(4400), str(-2**63))

SIZE_KEYWORDS = (
    ":batch", ":layers", ":microbatches", ":batches", ":vocab", ":steps", ":every", ":checkpoint",
    ":context", ":width", ":heads", ":ff", ":hidden", ":classes", ":out", ":dim", ":kernel",
    ":padding", ":stride", ":size", ":wide", ":high", ":low", ":axis", ":warmup", ":seed",
)
# Counts of time, not of memory: a big accepted value is a long run by right.
TIME_KEYWORDS = (":steps", ":every", ":checkpoint", ":warmup", ":seed")

STRINGS = (
    '""', '"/"', '"."', '"/dev/null"', '"/dev/zero"', '"/proc/self/status"', '"../../../etc/passwd"',
    '"data"', '"data/missing.npz"', '"data/spirals.npz\\0"', '"s3://bucket/run"', '"\\q"',
    '"' + "x" * 5000 + '.npz"', '"data/spirals.safetensors"', '"\x1b[31mred\x1b[0m.npz"',
    '"\u202eevil.npz"', '"\\"', '"unterminated',
)

# Characters a name may smuggle into a message: terminal controls, C1 controls, bidi overrides,
# zero-width and combining marks, non-BMP, a NUL.
ODD_CHARACTERS = ("\x1b[31m", "\x1b]0;title\x07", "\x07", "\x08", "\x00", "\x7f", "\x9b", "\r",
                  "\u202e", "\u200b", "\u0301", "\U0001F600", "\ufeff", "\u00a0")
UNICODE_NAMES = ("ĥidden", "隠れ", "😀", "e\u0301", "\U0001F600" * 1000, "Hidden", "x\u00a0y", "ｘ",
                 "\u0399\u0345", "ﬁ", "𝔵")
LONG_NAME_LENGTHS = (300, 3000, 10000, 100000)
DEPTHS = (50, 255, 300, 1000, 5000, 100000)
CHAIN_LENGTHS = (200, 1000, 3000)
UNARY_OPS = ("relu", "tanh", "gelu")
EXTRA_TOKENS = ("(", ")", "()", ":as", ":out", "let", "record", "param", "#t", "'x", "nil", ":",
                "::", '"', "\\", "1e999", ":seed", "defrun", "defgraph", "(batch -1)", "(repeat 3",
                "true", "false", "f32", "bf16", "i32", ":salt", "(:step :trip)", "batch")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _is_number(token: str) -> bool:
    return bool(_NUMBER.match(token))


def _is_symbol(token: str) -> bool:
    return bool(_SYMBOL.match(token)) and not _is_number(token)


def _positions(toks: list[str], keep: Callable[[str], bool]) -> list[int]:
    return [i for i, token in enumerate(toks) if keep(token)]


def _matching_close(toks: list[str], open_index: int) -> int | None:
    depth = 0
    for i in range(open_index, len(toks)):
        depth += {"(": 1, ")": -1}.get(toks[i], 0)
        if depth == 0:
            return i
    return None


def _spans(toks: list[str]) -> list[tuple[int, int]]:
    """Every balanced (...) as (index of '(', index of its ')')."""
    spans, opened = [], []
    for i, token in enumerate(toks):
        if token == "(":
            opened.append(i)
        elif token == ")" and opened:
            spans.append((opened.pop(), i))
    return spans


def _replace_one(rng: random.Random, text: str, keep: Callable[[str], bool],
                 replacement: Callable[[random.Random], str]) -> str:
    """One token that `keep` selects, replaced by `replacement(rng)`."""
    toks = tokens(text)
    places = _positions(toks, keep)
    if not places:
        return text
    toks[rng.choice(places)] = replacement(rng)
    return "".join(toks)


def _one_of(choices) -> Callable[[random.Random], str]:
    return lambda rng: rng.choice(choices)


# -- bytes ------------------------------------------------------------------------------------

_INTERESTING_BYTES = (b"\x00", b"\x1b", b"\x7f", b"\xff", b"\xe9", b"\xc3", b"\t", b"\r", b"\n",
                      b"(", b")", b'"', b"\\", b";", b":", b"-", b"e", b".", b"#", b"'")


def _as_bytes(text: str) -> bytearray:
    return bytearray(text.encode("utf-8", "surrogateescape"))


def _as_text(data: bytes) -> str:
    return bytes(data).decode("utf-8", "surrogateescape")


def byte_flip(rng, text):
    data = _as_bytes(text)
    if data:
        data[rng.randrange(len(data))] = rng.randrange(256)
    return _as_text(data)


def byte_insert(rng, text):
    data = _as_bytes(text)
    at = rng.randrange(len(data) + 1)
    return _as_text(data[:at] + rng.choice(_INTERESTING_BYTES) + data[at:])


def byte_delete(rng, text):
    data = _as_bytes(text)
    at = rng.randrange(len(data) + 1)
    return _as_text(data[:at] + data[at + rng.randint(1, 16):])


def byte_duplicate(rng, text):
    data = _as_bytes(text)
    at = rng.randrange(len(data) + 1)
    piece = data[at:at + rng.randint(1, 64)]
    return _as_text(data[:at] + piece + piece + data[at + len(piece):])


def truncate(rng, text):
    data = _as_bytes(text)
    return _as_text(data[:rng.randrange(len(data) + 1)])


# -- tokens -----------------------------------------------------------------------------------

def _significant(toks):
    return [i for i, token in enumerate(toks) if not token.isspace()]


def token_delete(rng, text):
    toks = tokens(text)
    places = _significant(toks)
    if places:
        del toks[rng.choice(places)]
    return "".join(toks)


def token_duplicate(rng, text):
    toks = tokens(text)
    places = _significant(toks)
    if places:
        at = rng.choice(places)
        toks.insert(at, toks[at] + " ")
    return "".join(toks)


def token_swap(rng, text):
    toks = tokens(text)
    places = _significant(toks)
    if len(places) >= 2:
        a, b = rng.sample(places, 2)
        toks[a], toks[b] = toks[b], toks[a]
    return "".join(toks)


def token_replace(rng, text):
    toks = tokens(text)
    places = _significant(toks)
    if places:
        pool = [toks[i] for i in places] + list(EXTRA_TOKENS)
        toks[rng.choice(places)] = rng.choice(pool)
    return "".join(toks)


def paren_insert(rng, text):
    toks = tokens(text)
    toks.insert(rng.randrange(len(toks) + 1), rng.choice(("(", ")", "((", "))", "()")))
    return "".join(toks)


def paren_delete(rng, text):
    return _replace_one(rng, text, lambda t: t in ("(", ")"), _one_of(("",)))


# -- numbers ----------------------------------------------------------------------------------

def number_replace(rng, text):
    return _replace_one(rng, text, _is_number, _one_of(NUMBERS))


def number_insert(rng, text):
    toks = tokens(text)
    toks.insert(rng.randrange(len(toks) + 1), " " + rng.choice(NUMBERS) + " ")
    return "".join(toks)


# -- nesting ----------------------------------------------------------------------------------

def deep_parens(rng, text):
    """An atom wrapped in many parentheses: the reader's depth, and every stage after it."""
    toks = tokens(text)
    places = _positions(toks, lambda t: _is_symbol(t) or _is_number(t))
    if not places:
        return text
    at, depth = rng.choice(places), rng.choice(DEPTHS)
    closing = ")" * depth if rng.random() < 0.8 else ""
    toks[at] = "(" * depth + toks[at] + closing
    return "".join(toks)


def op_chain(rng, text):
    """A legal chain of nested unary ops: (relu (relu ... (relu x)))."""
    toks = tokens(text)
    places = [i for i in range(len(toks) - 1) if toks[i] == "(" and toks[i + 1] in UNARY_OPS]
    if not places:
        return text
    at = rng.choice(places)
    close = _matching_close(toks, at)
    if close is None:
        return text
    length, op = rng.choice(CHAIN_LENGTHS), toks[at + 1]
    toks[close] = ")" + ")" * length
    toks[at] = f"({op} " * length + "("
    return "".join(toks)


def let_chain(rng, text):
    """Thousands of lets, each reading the one before, after the first let of a graph."""
    toks = tokens(text)
    places = [i for i in range(len(toks) - 2) if toks[i] == "(" and toks[i + 1] == "let"]
    if not places:
        return text
    at = rng.choice(places)
    close = _matching_close(toks, at)
    name = toks[at + 3] if at + 3 < len(toks) else ""
    if close is None or not _is_symbol(name):
        return text
    length = rng.choice(CHAIN_LENGTHS)
    chain = [f"(let {name}--{k + 1} (relu {name if k == 0 else f'{name}--{k}'}))" for k in range(length)]
    toks[close] = ")\n  " + "\n  ".join(chain)
    return "".join(toks)


def graph_call_chain(rng, text):
    """A chain of defgraphs, each calling the one before, the last one the run's model."""
    match = re.search(r":model \(([^\s()]+) ", text)
    if not match:
        return text
    length, model = rng.choice(CHAIN_LENGTHS), match.group(1)
    graphs = [f"(defgraph chain-{k + 1} (x) ({model if k == 0 else f'chain-{k}'} x :as c))"
              for k in range(length)]
    text = text[:match.start(1)] + f"chain-{length}" + text[match.end(1):]
    return "\n".join(graphs) + "\n" + text


def repeat_huge(rng, text):
    """A `repeat` count drawn from the sizes (:layers feeds it in char-lm)."""
    return re.sub(r"\(repeat (\S+)", lambda m: f"(repeat {rng.choice(SIZES)}", text, count=1)


# -- names ------------------------------------------------------------------------------------

def _long_name(rng) -> str:
    length = rng.choice(LONG_NAME_LENGTHS)
    unit = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(64))
    return (unit * (length // 64 + 1))[:length]


def name_long(rng, text):
    return _replace_one(rng, text, _is_symbol, lambda r: "x" + _long_name(r))


def keyword_long(rng, text):
    return _replace_one(rng, text, lambda t: t.startswith(":") and len(t) > 1,
                        lambda r: ":" + _long_name(r))


def name_typo(rng, text):
    """A near miss of a defined name: 'did you mean' territory."""
    toks = tokens(text)
    places = _positions(toks, lambda t: _is_symbol(t) and len(t) > 2)
    if places:
        at = rng.choice(places)
        word = toks[at]
        cut = rng.randrange(len(word) - 1)
        toks[at] = word[:cut] + word[cut + 1] + word[cut] + word[cut + 2:]
    return "".join(toks)


def name_control(rng, text):
    toks = tokens(text)
    places = _positions(toks, lambda t: _is_symbol(t) or t.startswith('"') or t.startswith(":"))
    if places:
        at = rng.choice(places)
        word = toks[at]
        cut = rng.randrange(1, max(2, len(word)))
        toks[at] = word[:cut] + rng.choice(ODD_CHARACTERS) + word[cut:]
    return "".join(toks)


def name_unicode(rng, text):
    return _replace_one(rng, text, _is_symbol, _one_of(UNICODE_NAMES))


# -- sizes ------------------------------------------------------------------------------------

def _size_replace(rng, text, keywords, sizes):
    toks = tokens(text)
    places = [i for i, token in enumerate(toks) if token in keywords]
    rng.shuffle(places)
    for at in places:
        following = [i for i in range(at + 1, min(at + 3, len(toks))) if not toks[i].isspace()]
        if following and toks[following[0]] not in "()":
            toks[following[0]] = rng.choice(sizes)
            return "".join(toks)
    return text


def size_replace(rng, text):
    return _size_replace(rng, text, SIZE_KEYWORDS, SIZES)


def run_size_replace(rng, text):
    """Sizes for a case that is run: no counts of time, no middle-sized values."""
    keywords = tuple(k for k in SIZE_KEYWORDS if k not in TIME_KEYWORDS)
    return _size_replace(rng, text, keywords, RUN_SIZES)


def size_insert(rng, text):
    """A size keyword the file does not give, added to its defrun."""
    keyword = rng.choice((":microbatches", ":batch", ":steps"))
    return re.sub(r"\(defrun (\S+)", lambda m: f"{m.group(0)} {keyword} {rng.choice(SIZES)}", text, count=1)


def _shape_replace(rng, text, sizes):
    toks = tokens(text)
    shapes = [(a, b) for a, b in _spans(toks)
              if b - a > 1 and all(_is_symbol(t) or _is_number(t) or t.isspace() for t in toks[a + 1:b])]
    if not shapes:
        return text
    a, b = rng.choice(shapes)
    dims = [i for i in range(a + 1, b) if not toks[i].isspace()]
    toks[rng.choice(dims)] = rng.choice(sizes)
    return "".join(toks)


def shape_replace(rng, text):
    """An element of a list of atoms, such as a shape: (param positions (context width))."""
    return _shape_replace(rng, text, SIZES)


def run_shape_replace(rng, text):
    return _shape_replace(rng, text, RUN_SIZES)


# -- strings and splices ----------------------------------------------------------------------

def string_replace(rng, text):
    return _replace_one(rng, text, lambda t: t.startswith('"'), _one_of(STRINGS))


def splice(rng, text, donors: tuple[str, ...] = ()):
    """A balanced form of another seed in place of one of this file's."""
    toks = tokens(text)
    here = _spans(toks)
    donor = tokens(rng.choice(donors)) if donors else toks
    there = _spans(donor)
    if not here or not there:
        return text
    a, b = rng.choice(here)
    c, d = rng.choice(there)
    return "".join(toks[:a] + donor[c:d + 1] + toks[b + 1:])


@dataclass(frozen=True)
class Mutator:
    name: str
    family: str
    apply: Callable[[random.Random, str], str]
    weight: float = 1.0  # how often it is drawn, against 1 for most


# Mutations that build files of 10^4 to 10^5 tokens: a case takes tenths of a second, not
# milliseconds, so they are drawn less often to keep the CI run short.
HEAVY = 0.3
# Mutations that mostly stop the reader: drawn less often, so that more cases reach the later
# stages (forms, graph, the report), where a file must be well formed to get.
BREAKING = 0.5


MUTATORS = (
    Mutator("byte-flip", "bytes", byte_flip, BREAKING),
    Mutator("byte-insert", "bytes", byte_insert, BREAKING),
    Mutator("byte-delete", "bytes", byte_delete, BREAKING),
    Mutator("byte-duplicate", "bytes", byte_duplicate, BREAKING),
    Mutator("truncate", "bytes", truncate, BREAKING),
    Mutator("token-delete", "tokens", token_delete, BREAKING),
    Mutator("token-duplicate", "tokens", token_duplicate, BREAKING),
    Mutator("token-swap", "tokens", token_swap, BREAKING),
    Mutator("token-replace", "tokens", token_replace, BREAKING),
    Mutator("paren-insert", "tokens", paren_insert, BREAKING),
    Mutator("paren-delete", "tokens", paren_delete, BREAKING),
    Mutator("number-replace", "numbers", number_replace),
    Mutator("number-insert", "numbers", number_insert),
    Mutator("deep-parens", "nesting", deep_parens, HEAVY),
    Mutator("op-chain", "nesting", op_chain, HEAVY),
    Mutator("let-chain", "nesting", let_chain, HEAVY),
    Mutator("graph-call-chain", "nesting", graph_call_chain, HEAVY),
    Mutator("repeat-size", "sizes", repeat_huge),
    Mutator("name-long", "names", name_long, HEAVY),
    Mutator("keyword-long", "names", keyword_long, HEAVY),
    Mutator("name-typo", "names", name_typo),
    Mutator("name-control", "names", name_control),
    Mutator("name-unicode", "names", name_unicode),
    Mutator("size-replace", "sizes", size_replace),
    Mutator("size-insert", "sizes", size_insert),
    Mutator("shape-replace", "sizes", shape_replace),
    Mutator("string-replace", "strings", string_replace),
    Mutator("splice", "splice", splice),
)
# A case that is run for two steps: mutations that keep the file well formed more often than
# not, and whose accepted results stay small and fast (no token swaps: one that moves the seed
# to :steps is a long run by right, not a hang).
RUN_MUTATORS = tuple(m for m in MUTATORS if m.name in {
    "name-typo", "let-chain", "op-chain", "graph-call-chain", "splice", "string-replace",
}) + (Mutator("size-replace", "sizes", run_size_replace, 3.0),
      Mutator("shape-replace", "sizes", run_shape_replace))


@dataclass(frozen=True)
class Seed:
    name: str
    text: str
    example: bool


@dataclass(frozen=True)
class Case:
    index: int
    command: str            # "check" or "run"
    seed: str               # the seed file's name
    mutations: tuple[str, ...]
    text: str               # surrogateescape-decoded: encode with it to get the file's bytes
    files: tuple[tuple[str, bytes], ...] = ()  # other files the case reads (a record file), by name
    environ: tuple[tuple[str, str], ...] = ()  # variables set for the case's commands
    s3: bool = False        # whether its run writes checkpoints to the test S3 server

    def data(self) -> bytes:
        return self.text.encode("utf-8", "surrogateescape")


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "surrogateescape")


def load_seeds() -> tuple[tuple[Seed, ...], tuple[Seed, ...]]:
    """(every seed, the runnable examples shrunk to two steps)."""
    examples = [Seed(p.stem, _read(p), True) for p in sorted(EXAMPLES.glob("*.sexp"))]
    corpus = [Seed(str(p.relative_to(MALFORMED)), _read(p), False) for p in sorted(MALFORMED.rglob("*.sexp"))]
    runnable = tuple(Seed(s.name, shrink_for_run(s.text), True) for s in examples if s.name in RUNNABLE)
    return tuple(examples + corpus), runnable


def shrink_for_run(text: str) -> str:
    """Two steps, each pass and checkpoint every step with one batch, and small batches."""
    for pattern, value in ((r":steps \d+", ":steps 2"), (r":every \d+", ":every 1"),
                           (r":batches \d+", ":batches 1"), (r":checkpoint \d+", ":checkpoint 1"),
                           (r":batch \d+", ":batch 8")):
        text = re.sub(pattern, value, text)
    return text


@dataclass(frozen=True)
class Plan:
    """Which cases run `run`: every `run_every`-th; the rest `check`."""
    seed: int = 20261201
    run_every: int = 50


def make_case(index: int, seeds, runnable, plan: Plan = Plan()) -> Case:
    rng = random.Random(f"{plan.seed}:{index}")
    is_run = plan.run_every and index % plan.run_every == plan.run_every - 1
    if is_run:
        pool, mutators = runnable, RUN_MUTATORS
    else:
        # Examples are the richer seeds: half the cases start from one.
        examples = [s for s in seeds if s.example]
        pool, mutators = (examples if rng.random() < 0.5 else seeds), MUTATORS
    seed = rng.choice(pool)
    donors = tuple(s.text for s in pool)
    text, names = seed.text, []
    # A run case takes one mutation, so that more of them pass `check` and reach the run loop.
    count = 1 if is_run else rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
    for mutator in rng.choices(mutators, weights=[m.weight for m in mutators], k=count):
        text = (splice(rng, text, donors) if mutator.apply is splice else mutator.apply(rng, text))
        names.append(mutator.name)
    return Case(index, "run" if is_run else "check", seed.name, tuple(names), text)
