"""cuDNN's native pattern graphs as the plan sees them (backends/cuda/patterns.py): the table's matches in
the graphs of real models (char-lm and the CNN example, in bf16 and float32), the conditions
that keep a group from being one (another reader, another bias), which patterns a run has on,
and the words the recorded device and the report use for them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sexpgpu.graph import compile_program
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.lang.forms import load_experiment
from sexpgpu.plan.device import patterns_text
from sexpgpu.plan.levels import How, determinism_line
from sexpgpu.backends.cuda.patterns import (
    OFF_BY_SETTING,
    PATTERN_NAMES,
    PATTERNS,
    PatternsInEffect,
    PatternUse,
    decide_patterns,
    match_patterns,
    patterns_line,
)

from fake_device import A100

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def program(tmp_path, name: str, precision: str):
    text = (EXAMPLES / f"{name}.sexp").read_text().replace(":layers 2", ":layers 1")
    path = tmp_path / f"{name}.sexp"
    path.write_text(text.replace(":seed ", f":precision {precision} :seed "))
    return compile_program(load_experiment(str(path)))


def matched(graph, names=PATTERN_NAMES) -> list:
    return [(match.pattern, match.key.key()) for match in match_patterns(graph, names).values()]


def test_the_table_is_one_entry_a_pattern():
    assert PATTERN_NAMES == ("attention", "products", "convolutions")
    assert all(callable(pattern.match) and pattern.title for pattern in PATTERNS)


def test_bf16_char_lm_has_attention_and_its_products_with_their_biases(tmp_path):
    lm = program(tmp_path, "char-lm", "bf16")
    found = match_patterns(lm.training.micro, PATTERN_NAMES)
    attention = [match for match in found.values() if match.pattern == "attention"]
    forward, backward = sorted(attention, key=lambda match: match.key.role, reverse=True)
    assert forward.key.role == "Forward" and forward.key.stats and forward.key.causal
    assert (forward.key.batch, forward.key.heads, forward.key.queries, forward.key.width) == (16, 4, 64, 16)
    assert backward.key.role == "Backward" and [node.op for node in backward.nodes] == ["attention_grad_q",
                                                                                        "attention_grad_kv"]
    assert backward.emit is backward.nodes[0] and backward.results == backward.nodes
    products = [match for match in found.values() if match.pattern == "products"]
    # the MLP's two projections and the head, each with its bias; attention's projections have
    # none, so they are no epilogue; the language's gelu is its steps (its gradient reads the
    # erf), not the gelu op, so the activation is not part of the group
    assert sorted(match.key.key() for match in products) == [
        "Product { rows: 1024, inner: 256, columns: 64 } bf16 + bias",
        "Product { rows: 1024, inner: 64, columns: 256 } bf16 + bias",
        "Product { rows: 1024, inner: 64, columns: 256 } bf16 + bias",
    ]
    up = products[0]
    assert [node.op for node in up.nodes] == ["matmul", "cast", "add"] and up.results == up.nodes[2:]
    assert up.emit is up.nodes[-1] and up.operands[2].shape == (256,) and not up.key.keeps_sum
    # an evaluation pass keeps no biased sum (no gradient reads it) and writes no statistics
    evaluated = match_patterns(lm.passes["eval"], PATTERN_NAMES).values()
    assert not any(getattr(match.key, "keeps_sum", False) for match in evaluated)
    assert [match.key.stats for match in evaluated if match.pattern == "attention"] == [False]


def test_float32_char_lm_has_none(tmp_path):
    assert matched(program(tmp_path, "char-lm", "f32").training.micro) == []


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_the_cnns_convolutions_with_their_relu_are_matched_in_both_precisions(tmp_path, precision):
    cnn = program(tmp_path, "cnn", precision)
    found = [match for match in match_patterns(cnn.training.micro, PATTERN_NAMES).values()
             if match.pattern == "convolutions"]
    assert [match.key.key() for match in found] == [
        f"Forward Spec {{ batch: 32, height: 12, width: 12, channels: 1, kh: 3, kw: 3, out: 8, stride: 1, padding: 1 }} "
        f"{precision} + bias + relu, keeping the sum",
        f"Forward Spec {{ batch: 32, height: 6, width: 6, channels: 8, kh: 3, kw: 3, out: 16, stride: 1, padding: 1 }} "
        f"{precision} + bias + relu, keeping the sum",
    ]
    assert all(match.key.keeps_sum and match.operands[2].shape == (match.key.product.out, 1, 1) for match in found)
    # the head's linear is a float32 product: no pattern (bf16's is)
    assert any(match.pattern == "products" for match in match_patterns(cnn.training.micro, PATTERN_NAMES).values()) \
        == (precision == "bf16")
    assert matched(cnn.training.micro, ("attention",)) == [] and match_patterns(cnn.training.micro, ()) == {}


def layer(read_twice=False, bias_shape=(4,), early_reader=False):
    e = Emitter()
    x, w, b = e.input("x", "f32", (3, 2)), e.input("w", "f32", (2, 4)), e.input("b", "f32", bias_shape)
    product = e("matmul", e("cast", x, dtype="bf16"), e("cast", w, dtype="bf16"))
    widened = e("cast", product, dtype="f32")
    summed = e("add", widened, b)
    outputs = {"y": None}
    if early_reader:
        outputs["early"] = e("neg", summed)
    outputs["y"] = e("relu", summed)
    if read_twice:
        outputs["again"] = e("neg", widened)
    return e.graph({"x": x, "w": w, "b": b}, outputs)


def test_a_group_read_from_outside_or_with_another_bias_is_no_match():
    assert matched(layer()) == [("products", "Product { rows: 3, inner: 2, columns: 4 } bf16 + bias + relu")]
    assert matched(layer(read_twice=True)) == []
    assert matched(layer(bias_shape=(3, 4))) == []
    # the activation is left out when another reader of the sum comes before it
    assert matched(layer(early_reader=True)) == [("products", "Product { rows: 3, inner: 2, columns: 4 } bf16 + bias")]


def test_which_patterns_are_on():
    supported = dict.fromkeys(PATTERN_NAMES)
    assert decide_patterns(None, supported) == PatternsInEffect(PATTERN_NAMES, ())
    assert decide_patterns("on", supported).on == PATTERN_NAMES
    off = decide_patterns("off", supported)
    assert off.on == () and dict(off.off) == dict.fromkeys(PATTERN_NAMES, OFF_BY_SETTING)
    partly = decide_patterns(None, dict(supported, products="cuDNN 8907 is older than 90000"))
    assert partly.on == ("attention", "convolutions") and partly.reason("products") == "cuDNN 8907 is older than 90000"
    assert decide_patterns(None, {}).on == ()


def test_the_device_line_names_the_patterns_on():
    assert patterns_text(PATTERN_NAMES, PATTERN_NAMES) == "on" and patterns_text((), PATTERN_NAMES) == "off"
    assert patterns_text(("convolutions", "attention"), PATTERN_NAMES) == "attention+convolutions"
    assert patterns_text((), ()) == "off"  # a device without pattern graphs
    assert A100.line().endswith("Triton 3.6.0, patterns on")
    assert replace(A100, patterns=()).line().endswith("Triton 3.6.0, patterns off")
    assert replace(A100, patterns=("attention",)).line().endswith("Triton 3.6.0, patterns attention")
    # another machine's patterns are other device facts: a run pinned to its choices is level 3
    theirs = replace(A100, patterns=()).line()
    assert determinism_line(How("pinned", "their run", theirs), A100.line()).startswith(
        f"3: pinned to the choices of their run, recorded on {theirs}; this machine is {A100.line()}")


def test_the_report_line_says_what_is_on_and_why_the_rest_is_off():
    assert patterns_line(decide_patterns("off", {}), ()) == "off: SEXPGPU_PATTERNS=off"
    assert patterns_line(decide_patterns(None, dict.fromkeys(PATTERN_NAMES, "no GPU")), ()) == "off: no GPU"
    uses = [PatternUse("attention", "Forward A", True), PatternUse("attention", "Backward A", False, "declined\n  here"),
            PatternUse("attention", "Forward A", True), PatternUse("products", "P", True)]
    decided = decide_patterns(None, dict(dict.fromkeys(PATTERN_NAMES), convolutions="cuDNN 8907 is older than 90000"))
    assert patterns_line(decided, uses) == (
        "fused attention on: 1 of 2 by cuDNN, the rest lowered as without patterns (cuDNN declines Backward A: "
        "declined here); products with their epilogues on: 1 of 1 by cuDNN; convolutions with their epilogues off: "
        "cuDNN 8907 is older than 90000")
    long = patterns_line(PatternsInEffect(("attention",)), [PatternUse("attention", "A", False, "x" * 500)])
    assert long.count("x") == 160 and "...)" in long
