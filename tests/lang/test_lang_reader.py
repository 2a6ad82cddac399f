"""The reader: every atom kind, escapes, comments, nesting, and the place of every datum."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sexpgpu.errors import Location, SexpgpuError
from sexpgpu.lang.reader import read_source, read_text
from sexpgpu.lang.syntax import Float, Integer, Keyword, SList, String, Symbol


def one(text: str):
    (datum,) = read_text(text, "t.sexp")
    return datum


@pytest.mark.parametrize("text, value", [("12", 12), ("-3", -3), ("+7", 7), ("0", 0), ("1_000", 1000),
                                         ("18446744073709551615", 2**64 - 1)])
def test_integers(text, value):
    datum = one(text)
    assert isinstance(datum, Integer) and datum.value == value


@pytest.mark.parametrize("text, value", [("0.5", 0.5), ("-0.5", -0.5), ("1e-3", 0.001), ("2.5E+4", 25000.0),
                                         ("1.", 1.0), (".5", 0.5), ("-.25", -0.25), ("3e2", 300.0),
                                         ("1_0.5", 10.5)])
def test_floats_keep_their_text(text, value):
    datum = one(text)
    assert isinstance(datum, Float) and datum.value == value and datum.text == text and str(datum) == text


@pytest.mark.parametrize("text", ["inf", "-inf", "+inf", "nan", "block0/attn/wq", "-", "+", "log-softmax",
                                  "x'", "a.b", "<=", "relu"])
def test_symbols(text):
    datum = one(text)
    assert datum == Symbol(text, None)


def test_keywords():
    assert one(":seed") == Keyword("seed", None)
    assert one(":min-lr") == Keyword("min-lr", None)
    assert str(one(":weight-decay")) == ":weight-decay"


@pytest.mark.parametrize("text, value", [
    (r'"plain"', "plain"),
    (r'"a\nb"', "a\nb"),
    (r'"tab\there"', "tab\there"),
    (r'"cr\r"', "cr\r"),
    (r'"nul\0"', "nul\0"),
    (r'"back\\slash"', "back\\slash"),
    (r'"say \"hi\""', 'say "hi"'),
    ('"semi; not a comment"', "semi; not a comment"),
    ('"(parens)"', "(parens)"),
    ('"caf\u00e9 \u2603"', "caf\u00e9 \u2603"),
    ('"two\nlines"', "two\nlines"),
    ('""', ""),
])
def test_strings_and_escapes(text, value):
    datum = one(text)
    assert isinstance(datum, String) and datum.value == value


def test_comments_are_skipped_anywhere():
    data = read_text("; head\n(a ; inside\n b) ; after\n; tail without newline", "t.sexp")
    assert data == [SList((Symbol("a", None), Symbol("b", None)), None)]


def test_nesting_and_empty_lists():
    datum = one("(a (b (c)) () 1)")
    assert datum == SList((
        Symbol("a", None),
        SList((Symbol("b", None), SList((Symbol("c", None),), None)), None),
        SList((), None),
        Integer(1, None),
    ), None)
    assert datum.head == "a" and len(datum) == 4 and datum[2].items == ()


def test_atoms_end_at_delimiters():
    assert one('(f"s"(g)x)').items == (Symbol("f", None), String("s", None), SList((Symbol("g", None),), None),
                                       Symbol("x", None))


def test_every_datum_knows_its_line_and_column():
    text = "(defrun r\n\t:seed 7 ; c\n  :lr (adam \"x\"))\n"
    run = one(text)
    assert run.loc == Location("t.sexp", 1, 1)
    assert run.end == Location("t.sexp", 3, 17)
    _, name, seed, seven, lr, adam = run.items
    assert name.loc == Location("t.sexp", 1, 9)
    assert seed.loc == Location("t.sexp", 2, 2)  # a tab is one column
    assert seven.loc == Location("t.sexp", 2, 8)
    assert lr.loc == Location("t.sexp", 3, 3)
    assert adam.loc == Location("t.sexp", 3, 7) and adam.items[1].loc == Location("t.sexp", 3, 13)


def test_positions_after_a_multiline_string_and_crlf():
    data = read_text('"a\nbc" x\r\ny', "t.sexp")
    assert [d.loc for d in data] == [Location("t.sexp", 1, 1), Location("t.sexp", 2, 5), Location("t.sexp", 3, 1)]


def test_columns_count_characters_not_bytes():
    assert read_text('"\u00e9\u00e9" x', "t.sexp")[1].loc.column == 6


def test_a_byte_order_mark_is_not_a_symbol():
    assert read_text("\ufeff(a)", "t.sexp")[0].loc == Location("t.sexp", 1, 1)


@pytest.mark.parametrize("text, code, line, column", [
    ("(a (b)", "E-READ-001", 1, 1),
    ("(a\n  (b c)\n(d)", "E-READ-001", 1, 1),
    ("(a))", "E-READ-002", 1, 4),
    ('(a "bc', "E-READ-003", 1, 4),
    ('"ab\\', "E-READ-003", 1, 1),
    ('(a "b\\qc")', "E-READ-004", 1, 6),
    ("1.2.3", "E-READ-005", 1, 1),
    ("(x 0x10)", "E-READ-005", 1, 4),
    ("-1e", "E-READ-005", 1, 1),
    ("2e400", "E-READ-005", 1, 1),
    (":", "E-READ-007", 1, 1),
    ("(a\n :2x)", "E-READ-007", 2, 2),
    ("'quote", "E-READ-007", 1, 1),
    ("#t", "E-READ-007", 1, 1),
    ("\u03bb", "E-READ-007", 1, 1),
])
def test_bad_text_is_located(text, code, line, column):
    with pytest.raises(SexpgpuError) as caught:
        read_text(text, "t.sexp")
    assert caught.value.code == code
    assert caught.value.location == Location("t.sexp", line, column)


def test_missing_paren_hint_names_the_next_top_level_form():
    with pytest.raises(SexpgpuError) as caught:
        read_text("(a\n  (b c)\n\n(d)", "t.sexp")
    assert "line 4" in caught.value.hint


def test_read_source_hashes_the_bytes(tmp_path):
    path = tmp_path / "x.sexp"
    raw = "; caf\u00e9\n(a 1)\n".encode()
    path.write_bytes(raw)
    text, digest = read_source(str(path))
    assert text == raw.decode() and digest == hashlib.sha256(raw).hexdigest()
    assert read_text(text, str(path))[0].loc == Location(str(path), 2, 1)


def test_unreadable_files(tmp_path):
    for path in (str(tmp_path / "missing.sexp"), str(tmp_path)):
        with pytest.raises(SexpgpuError) as caught:
            read_source(path)
        assert caught.value.code == "E-FILE-001" and path in caught.value.render()


def test_not_utf8_is_located_at_the_byte(tmp_path):
    path = tmp_path / "x.sexp"
    path.write_bytes(b"(a)\n(b \xff)")
    with pytest.raises(SexpgpuError) as caught:
        read_source(str(path))
    assert caught.value.code == "E-READ-006" and caught.value.location == Location(str(path), 2, 4)


# --- printing and reading back: str(datum) is valid syntax for the same datum ---

_names = st.from_regex(r"[a-z][a-z0-9\-/]{0,6}", fullmatch=True).filter(lambda n: n not in ("inf", "nan"))
_atoms = st.one_of(
    st.integers(-(2**70), 2**70).map(lambda v: Integer(v, None)),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: Float(v, repr(v), None)),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8).map(lambda v: String(v, None)),
    _names.map(lambda v: Symbol(v, None)),
    _names.map(lambda v: Keyword(v, None)),
)
_data = st.recursive(_atoms, lambda inner: st.lists(inner, max_size=4).map(lambda v: SList(tuple(v), None)),
                     max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_data)
def test_printed_syntax_reads_back_the_same(datum):
    assert one(str(datum)) == datum
