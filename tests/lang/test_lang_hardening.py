"""Any text in, a coded error or a result out (issue 10): nesting, numbers of any length,
bounded "did you mean", control characters in messages. Each test failed before its fix."""

from __future__ import annotations

import time

import pytest

from sexpgpu.cli.main import main
from sexpgpu.errors import SexpgpuError, nearest_name
from sexpgpu.lang.forms import parse_experiment, select_run
from sexpgpu.lang.serialize import experiment_to_json
from sexpgpu.lang.reader import read_text
from sexpgpu.lang.syntax import Integer, SList

DEPTH = 3000  # past Python's recursion limit (1,000) several times over

RUN = """
(defrun r :seed 1 :data (text pydoc :context 8) :model (m x) :loss (cross-entropy y)
  :optimizer (sgd :lr 0.1) :batch 2 :steps 1)
"""


def nested_relu_file(depth: int) -> str:
    body = "(relu " * depth + "(embedding x :vocab 256 :dim 8 :as e)" + ")" * depth
    return f"(defgraph m (x) (linear {body} :out 256 :as head))\n" + RUN


def experiment_of(text: str):
    return select_run(parse_experiment(read_text(text, "t.sexp"), "t.sexp", ""), None)


def check(tmp_path, text: str, capsys) -> tuple[int, str]:
    path = tmp_path / "t.sexp"
    path.write_text(text)
    status = main(["check", str(path)])
    return status, capsys.readouterr().err


def test_lists_nest_deeper_than_the_recursion_limit():
    (datum,) = read_text("(" * DEPTH + "x" + ")" * DEPTH)
    depth = 0
    while isinstance(datum, SList):
        datum, depth = datum.items[0], depth + 1
    assert depth == DEPTH and datum.name == "x"


def test_an_unclosed_deep_list_is_reported_at_its_innermost_paren():
    with pytest.raises(SexpgpuError) as caught:
        read_text("(" * DEPTH + "x")
    assert caught.value.code == "E-READ-001"
    assert caught.value.location.column == DEPTH


def test_a_deep_list_at_top_level_is_a_coded_error(tmp_path, capsys):
    status, err = check(tmp_path, "(" * DEPTH + ")" * DEPTH, capsys)
    assert status == 2 and "E-FORM-001" in err


def test_a_body_thousands_of_ops_deep_is_checked_and_serialized():
    experiment = experiment_of(nested_relu_file(DEPTH))
    body = experiment_to_json(experiment)["graphs"]["m"]["body"][0]
    assert body.count("(relu ") == DEPTH and body == str(experiment.graphs["m"].body[0])


def test_check_accepts_a_body_thousands_of_ops_deep(tmp_path, capsys):
    status, err = check(tmp_path, nested_relu_file(DEPTH), capsys)
    assert status == 0, err


def test_an_error_deep_in_a_body_is_found_at_its_place():
    text = nested_relu_file(DEPTH).replace("(embedding x", "(let q x) (embedding x")
    with pytest.raises(SexpgpuError) as caught:
        experiment_of(text)
    assert caught.value.code == "E-FORM-012"
    assert caught.value.location.column == text.index("(let q") + 1


def test_integer_literals_of_any_length_are_read():
    digits = "7" * 5000
    (value,) = read_text(digits)
    assert isinstance(value, Integer) and str(value) == digits and value.value > 2**64
    (negative,) = read_text("-" + digits)
    assert negative.value < -(2**64)
    (exact,) = read_text("9" * 400)
    assert exact.value == int("9" * 400)


def test_an_integer_beyond_floats_where_a_float_is_expected_is_a_range_error():
    text = nested_relu_file(1).replace(":lr 0.1", ":lr 1" + "0" * 400)
    with pytest.raises(SexpgpuError) as caught:
        experiment_of(text)
    assert caught.value.code == "E-FORM-011"
    assert caught.value.location.column == text.splitlines()[3].index(":lr 1") + 5
    assert len(caught.value.message) < 200  # the number is shown shortened


def test_did_you_mean_is_bounded_for_long_names():
    long_name = "a" * 10_000
    start = time.perf_counter()
    assert nearest_name(long_name, [long_name[:-1], "b" * 9_999]) is None
    assert nearest_name("hiden", ["hidden", "x" * 10_000] + [f"n{i}" for i in range(100_000)]) == "hidden"
    assert time.perf_counter() - start < 5  # 55 s before


def test_did_you_mean_still_picks_the_first_nearest_name():
    assert nearest_name("relu", ["rely", "relu2", "reel"]) == "relu2"  # sorted first among distance 1
    assert nearest_name("lienar", ["linear", "layernorm"]) == "linear"
    assert nearest_name("zzzz", ["linear"]) is None


def test_control_characters_from_the_file_are_escaped_in_messages(tmp_path, capsys):
    status, err = check(tmp_path, nested_relu_file(1).replace("(relu ", "(re\x1b[2Jlu\u202e "), capsys)
    assert status == 2
    assert "\x1b" not in err and "\u202e" not in err
    assert "\\x1b[2J" in err


def test_a_long_name_is_shortened_in_messages(tmp_path, capsys):
    name = "abcdefghij" * 10_000
    status, err = check(tmp_path, nested_relu_file(1).replace("(relu ", f"({name} "), capsys)
    assert status == 2 and "E-GRAPH-002" in err
    assert len(err) < 1000 and "(100,003 characters)" in err  # the name, its quotes and the colon
