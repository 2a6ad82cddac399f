"""docs/language.md, "Limits": `check` refuses every size, count and bound that a run could not
carry out, with E-FORM-011 at the value (issue 10). Each case was accepted, hung or exited 3
before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph import compile_program
from sexpgpu.lang.forms import parse_experiment, select_run
from sexpgpu.lang.reader import read_text

ROOT = Path(__file__).resolve().parents[2]

MODEL = "(defgraph m (x) (linear (embedding x :vocab 256 :dim 8 :as e) :out 256 :as head))\n"
RUN = ("(defrun r :seed 1 :data (text pydoc :context 8) :model (m x) :loss (cross-entropy y)\n"
       "  :optimizer (sgd :lr 0.1) :batch 2 :steps 1 {extra})\n")
FIELDS = {"x": ((8,), "i32"), "y": ((8,), "i32")}


def compiled(text: str):
    experiment = select_run(parse_experiment(read_text(text, "t.sexp"), "t.sexp", ""), None)
    return compile_program(experiment, FIELDS)


def refused(text: str, marker: str, code: str = "E-FORM-011") -> SexpgpuError:
    """The error of `text`, checked to be `code` at the first character of `marker`."""
    with pytest.raises(SexpgpuError) as caught:
        compiled(text)
    error = caught.value
    assert error.code == code, error.render()
    if marker:
        line = next(number for number, line in enumerate(text.splitlines(), 1) if marker in line)
        assert (error.location.line, error.location.column) == (line, text.splitlines()[line - 1].index(marker) + 1)
    return error


def run_with(extra: str, replace: tuple = ("", "")) -> str:
    return MODEL.replace(*replace) + RUN.format(extra=extra)


@pytest.mark.parametrize("extra, marker", [
    (":batch 18446744073709551616", "18446744073709551616"),
    (":batch 2147483648", "2147483648"),
    (":steps " + "1" * 5000, "1111"),
    (":steps 2147483648", "2147483648"),
    (":microbatches 1000000000000", "1000000000000"),
    (":microbatches 1048577", "1048577"),
    (":passes ((eval :every 1 :batches 100000000000000000000))", "100000000000000000000"),
    (":passes ((eval :every 4294967296))", "4294967296"),
    (":checkpoint (every 1 :keep 4294967296)", "4294967296"),
    (":checkpoint 4294967296", "4294967296"),
    (":schedule (cosine :warmup 4294967296)", "4294967296"),
    (":schedule (warmup :steps 4294967296)", "4294967296"),
])
def test_run_counts_out_of_range(extra, marker):
    text = run_with(extra).replace(":batch 2 :steps 1 :batch", ":batch").replace(":steps 1 :steps", ":steps")
    refused(text, marker)


def test_a_text_context_has_a_range():
    refused(run_with("").replace(":context 8", ":context 4294967296"), "4294967296")


def test_the_largest_counts_are_accepted():
    text = run_with(":microbatches 1048576 :passes ((eval :every 2147483647 :batches 1048576))")
    assert compiled(text.replace(":steps 1 ", ":steps 2147483647 ")).training.microbatches == 1048576


def test_records_read_must_fit_int64():
    text = run_with(":microbatches 1048576").replace(":batch 2 :steps 1", ":batch 2147483647 :steps 2147483647")
    error = refused(text, "(defrun")
    assert "2^62" in error.message


@pytest.mark.parametrize("change, marker", [
    (("(embedding x :vocab 256", "(embedding x :vocab 0"), "0 :dim 8"),
    (("(embedding x :vocab 256 :dim 8 :as e)", "(attention (embedding x :vocab 256 :dim 8 :as e) :heads 0 :as a)"),
     "0 :as a"),
    (("(embedding x :vocab 256 :dim 8", "(embedding x :vocab 256 :dim 9223372036854775808"), "9223372036854775808"),
    (("(embedding x :vocab 256 :dim 8 :as e)", "(add (embedding x :vocab 256 :dim 8 :as e) "
      "(cast (randint (8) :low 0 :high 1180591620717411303424) f32))"), "1180591620717411303424"),
    (("(embedding x :vocab 256 :dim 8 :as e)", "(mul (embedding x :vocab 256 :dim 8 :as e) 1" + "0" * 400 + ")"),
     "(mul"),
    (("(embedding x :vocab 256 :dim 8 :as e)", "(pow (embedding x :vocab 256 :dim 8 :as e) 1" + "0" * 400 + ")"),
     "1000"),
    (("(embedding x :vocab 256 :dim 8 :as e)", "(add (param p (1048576 1048576 2) :init zeros) 1.0)"), "(param"),
    (("(embedding x :vocab 256 :dim 8 :as e)", "(add (embedding x :vocab 256 :dim 8 :as e) (param p (8 2147483648) :init zeros))"),
     "2147483648"),
])
def test_graph_sizes_out_of_range(change, marker):
    refused(run_with("", change), marker)


def test_an_int32_constant_must_fit_int32():
    text = run_with("", ("(linear (embedding x :vocab 256 :dim 8 :as e)",
                         "(linear (cast (add x 4294967296) f32)"))
    refused(text.replace(":vocab 256 :dim 8 :as e", ""), "(add x")


def test_a_repeat_count_has_a_range():
    model = ("(defgraph b (x) (relu x))\n"
             "(defgraph m (x) (linear (repeat 18446744073709551616 b (embedding x :vocab 256 :dim 8 :as e) :as r)"
             " :out 256 :as head))\n")
    refused(model + RUN.format(extra=""), "18446744073709551616")


def test_nested_repeats_stop_at_the_call_limit(monkeypatch):
    monkeypatch.setattr("sexpgpu.graph.frontend.build.CALLS_MAX", 5_000)  # the same rule, reached sooner
    model = ("(defgraph b (x) x)\n(defgraph c (x) (repeat 100000 b x :as r))\n"
             "(defgraph m (x) (linear (repeat 100000 c (embedding x :vocab 256 :dim 8 :as e) :as r)"
             " :out 256 :as head))\n")
    error = refused(model + RUN.format(extra=""), "(repeat 100000 b", "E-GRAPH-007")
    assert "5,000 graph calls" in error.message


def test_a_graph_stops_at_the_node_limit(monkeypatch):
    monkeypatch.setattr("sexpgpu.graph.core.emit.NODES_MAX", 20_000)  # the same rule, reached sooner
    model = ("(defgraph b (x) (neg (neg (neg (neg x)))))\n(defgraph c (x) (repeat 1000 b x :as r))\n"
             "(defgraph m (x) (linear (repeat 1000 c (embedding x :vocab 256 :dim 8 :as e) :as r)"
             " :out 256 :as head))\n")
    error = refused(model + RUN.format(extra=""), "", "E-GRAPH-007")
    assert "20,000" in error.message and error.location.line == 1  # at a (neg ...) of b


def test_a_pass_reads_at_most_2_to_the_62_bytes_of_text():
    text = run_with(":passes ((eval :every 1 :batches 1048576 :data (text pydoc :context 2147483647)))")
    refused(text.replace(":batch 2 :steps 1", ":batch 2147483647 :steps 1"), "(eval")


def test_an_update_too_large_for_one_tensor_is_placed_at_the_optimizer(tmp_path, capsys):
    # Each parameter fits the element limit; the update's flat vector of all of them does not.
    # Found by the fuzzer (case 19727): the error had no position.
    from sexpgpu.cli.main import main

    text = (ROOT / "examples" / "char-lm.sexp").read_text().replace(":width 64", ":width 1000000")
    path = tmp_path / "wide.sexp"
    path.write_text(text)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    line = next(number for number, row in enumerate(text.splitlines(), 1) if ":optimizer" in row)
    assert "E-FORM-011" in err and f"{path}:{line}:" in err
