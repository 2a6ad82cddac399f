"""Graph-stage errors: the code, the place in the file, and a message naming what is wrong."""

from __future__ import annotations

import pytest

from graph_helpers import NAME, experiment
from sexpgpu.errors import Location, SexpgpuError
from sexpgpu.graph import compile_program

SPECS = {"x": ((3,), "f32"), "y": ((), "i32"), "n": ((), "i32")}


def _run(model: str, body: str, loss: str = "(cross-entropy y)", extra: str = "") -> str:
    """A file whose graph `net` has `body`; line 1 is the defgraph, the body starts on line 2."""
    return (f"(defgraph net (x) :hidden 8 :classes 3\n{body})\n{extra}"
            f"(defrun r :seed 1 :data (records \"d.npz\") :model {model} :loss {loss}\n"
            f"  :optimizer (sgd :lr 0.1) :batch 4 :steps 1)\n")


CASES = [
    # (body, code, line, column, message parts)
    ("  (relu hiden)", "E-GRAPH-001", 2, 9, ["'hiden' is not defined", "Did you mean 'hidden'?"]),
    ("  (rellu x)", "E-GRAPH-002", 2, 4, ["unknown op 'rellu'", "Did you mean 'relu'?"]),
    ("  (lineer x :out 3 :as fc)", "E-GRAPH-002", 2, 4, ["Did you mean 'linear'?"]),
    ("  (add x)", "E-GRAPH-003", 2, 3, ["(add ...) takes 2 argument(s), found 1"]),
    ("  (relu x x)", "E-GRAPH-003", 2, 11, ["takes 1 argument(s), found 2"]),
    ("  (linear x :outt 3 :as fc)", "E-GRAPH-003", 2, 13, ["unknown keyword :outt", "Did you mean ':out'?"]),
    ("  (linear x :as fc)", "E-GRAPH-003", 2, 3, ["needs :out"]),
    ("  (linear x :out hidden :as fc :bias 1)", "E-GRAPH-003", 2, 38, ["expected true or false"]),
    ("  (sum x :axis 5)", "E-GRAPH-003", 2, 3, ["axis 5 is out of range for rank 2"]),
    ("  (cast x f16)", "E-GRAPH-003", 2, 11, ["expected a dtype", "Did you mean 'bf16'?"]),
    ("  (add x (param b (5) :init zeros))", "E-SHAPE-001", 2, 3, ["add: shapes (4 3) and (5) do not broadcast"]),
    ("  (matmul x (param w (4 2) :init zeros))", "E-SHAPE-001", 2, 3, ["(4 3) and (4 2) do not chain"]),
    ("  (reshape x (5 -1))", "E-SHAPE-001", 2, 3, ["cannot reshape (4 3) (12 elements) to (5 -1)"]),
    ("  (attention x :heads 2 :as a)", "E-SHAPE-001", 2, 3, ["D divisible by :heads 2", "(4 3)"]),
    ("  (mul x (param b (3) :init zeros :dtype bf16))", "E-DTYPE-001", 2, 3, ["mul: dtypes f32 and bf16 differ"]),
    ("  (embedding x :vocab 5 :dim 3 :as e)", "E-DTYPE-001", 2, 3, ["embedding needs i32 ids, got f32"]),
    ("  (let a (param w (3) :init zeros))\n  (add a (param w (4) :init ones))", "E-GRAPH-004", 3, 10,
     ["parameter 'w' is declared again", "test.sexp:2:10"]),
    ("  (net x)", "E-GRAPH-005", 2, 3, ["graph 'net' calls itself (net -> net)"]),
    ("  (repeat 2 net x)", "E-GRAPH-003", 2, 3, ["repeat needs :as PREFIX"]),
    ("  (trip)", "E-GRAPH-003", 2, 3, ["(trip) exists only in generators"]),
    ("  (dropout x :p 0.5 :salt :trip)", "E-GRAPH-003", 2, 3, [":trip salt exists only in generators"]),
    ("  (dropout x :p 0.5 :salt (field nn))", "E-GRAPH-001", 2, 3, ["no record field 'nn'", "Did you mean 'n'?"]),
    ("  (dropout x :p 0.5 :salt (field x))", "E-GRAPH-003", 2, 3, ["a salt field must hold one integer per record"]),
]


def _compile(text: str, specs=SPECS):
    return compile_program(experiment(text), specs)


@pytest.mark.parametrize("body, code, line, column, parts", CASES, ids=[case[0].strip()[:30] for case in CASES])
def test_graph_error(body, code, line, column, parts):
    with pytest.raises(SexpgpuError) as caught:
        _compile(_run("(net x)", body))
    error = caught.value
    rendered = error.render()
    assert error.code == code, rendered
    assert error.location == Location(NAME, line, column), rendered
    for part in parts:
        assert part in rendered, rendered
    assert "\n" not in rendered


def test_loss_errors_point_at_the_loss():
    text = _run("(net x)", "  (linear x :out 5 :as fc)", loss="(mse x)")
    with pytest.raises(SexpgpuError) as caught:
        _compile(text)
    assert caught.value.code == "E-SHAPE-001" and "(4 5) and target (4 3)" in caught.value.message
    assert caught.value.location.line == 3


def test_cross_entropy_labels_must_match_the_logits():
    text = _run("(net x)", "  (linear x :out classes :as fc)", loss="(cross-entropy y)")
    with pytest.raises(SexpgpuError) as caught:
        _compile(text, {"x": ((3,), "f32"), "y": ((2,), "i32")})
    assert caught.value.code == "E-SHAPE-001"
    assert "logits (4 3) need labels of shape (4), got (4 2)" in caught.value.message


def test_cross_entropy_labels_must_be_integers():
    with pytest.raises(SexpgpuError) as caught:
        _compile(_run("(net x)", "  (linear x :out classes :as fc)"), {"x": ((3,), "f32"), "y": ((), "f32")})
    assert caught.value.code == "E-DTYPE-001" and "labels is f32, expected i32" in caught.value.message


def test_a_loss_graph_must_give_a_scalar():
    extra = "(defgraph per-row (out target) (sub out target))\n"
    text = _run("(net x)", "  (linear x :out 3 :as fc)", loss="(per-row x)", extra=extra)
    with pytest.raises(SexpgpuError) as caught:
        _compile(text)
    assert caught.value.code == "E-SHAPE-001" and "the loss must be a float scalar" in caught.value.message


def test_a_generator_declares_no_parameters():
    text = ("(defgenerator g (record :x (linear (normal (batch 3)) :out 2 :as fc)))\n"
            "(defgraph net (x) (linear x :out 3 :as fc))\n"
            "(defrun r :seed 1 :data (generator g) :model (net x) :loss (mse x)\n"
            "  :optimizer (sgd :lr 0.1) :batch 4 :steps 1)\n")
    with pytest.raises(SexpgpuError) as caught:
        compile_program(experiment(text))
    assert caught.value.code == "E-GRAPH-003" and "a generator has no parameters" in caught.value.message
    assert caught.value.location == Location(NAME, 1, 28)


def test_a_generator_field_must_lead_with_the_batch():
    text = ("(defgenerator g (record :x (normal (3 2)) :y (randint (4) :low 0 :high 3)))\n"
            "(defgraph net (x) (linear x :out 3 :as fc))\n"
            "(defrun r :seed 1 :data (generator g) :model (net x) :loss (cross-entropy y)\n"
            "  :optimizer (sgd :lr 0.1) :batch 4 :steps 1)\n")
    with pytest.raises(SexpgpuError) as caught:
        compile_program(experiment(text))
    assert caught.value.code == "E-SHAPE-001" and "first axis must be the batch (4 records)" in caught.value.message
    assert caught.value.location == Location(NAME, 1, 28)
