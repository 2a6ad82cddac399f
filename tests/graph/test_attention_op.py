"""attention_core, the `attention` layer's one op: the interpreter computes it as the five
nodes it replaced (the same bits, float32 and bf16), its shape rules give coded errors, and
the layer emits it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from op_cases import random_array
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.core.ops import OpError
from sexpgpu.graph.passes.precision import with_precision

CPU = Interpreter()


def _composed(e, q, k, v, scale, causal):
    """The composition the layer emitted before attention_core."""
    rank = q.rank
    scores = e("matmul", q, e("transpose", k, perm=tuple(range(rank - 2)) + (rank - 1, rank - 2)))
    scores = e("mul", scores, e.const(scale, like=scores))
    if causal:
        scores = e("where", e("causal_mask", size=q.shape[-2]), scores, e.const(float("-inf"), like=scores))
    return e("matmul", e("softmax", scores, axis=rank - 1), v)


def _fused(e, q, k, v, scale, causal):
    return e("attention_core", q, k, v, scale=scale, causal=causal)


def _run(build, precision, shapes, scale, causal, values):
    e = Emitter()
    inputs = {name: e.input(name, "f32", shape) for name, shape in zip("qkv", shapes)}
    (out,) = with_precision(e, precision, [build(e, *inputs.values(), scale, causal)])
    return CPU.run(e.graph(inputs, {"out": out}), values)["out"]


@pytest.mark.parametrize("precision", ["f32", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_interpreter_gives_the_bits_of_the_composition_it_replaced(precision, causal):
    rng = np.random.default_rng(5)
    shapes = [(2, 3, 7, 8), (2, 3, 7, 8), (2, 3, 7, 5)]
    values = {name: random_array(rng, "f32", shape, "normal") * 2 for name, shape in zip("qkv", shapes)}
    scale = 1.0 / math.sqrt(8)
    fused = _run(_fused, precision, shapes, scale, causal, values)
    composed = _run(_composed, precision, shapes, scale, causal, values)
    assert fused.view(np.uint32).tolist() == composed.view(np.uint32).tolist()


def _shapes_error(shapes, causal=False) -> str:
    e = Emitter()
    nodes = [e.input(f"x{index}", "f32", shape) for index, shape in enumerate(shapes)]
    with pytest.raises(OpError) as caught:
        e("attention_core", *nodes, scale=1.0, causal=causal)
    return caught.value.code


def test_shapes_that_do_not_fit_are_coded_errors():
    assert _shapes_error([(2, 3, 4), (2, 5, 3), (2, 5, 4)]) == "E-SHAPE-001"  # q and k widths
    assert _shapes_error([(2, 3, 4), (3, 5, 4), (3, 5, 4)]) == "E-SHAPE-001"  # leading axes
    assert _shapes_error([(2, 3, 4), (2, 5, 4), (2, 4, 4)]) == "E-SHAPE-001"  # k and v lengths
    assert _shapes_error([(2, 3, 4), (2, 5, 4), (2, 5, 4)], causal=True) == "E-SHAPE-001"
    assert _shapes_error([(4,), (4,), (4,)]) == "E-SHAPE-001"


def test_the_attention_layer_emits_one_attention_core_per_layer():
    from pathlib import Path

    from sexpgpu.graph.training.program import compile_program
    from sexpgpu.lang.forms import load_experiment

    path = Path(__file__).resolve().parents[2] / "examples" / "char-lm.sexp"
    micro = compile_program(load_experiment(str(path))).training.micro
    counts = micro.op_counts()
    assert counts["attention_core"] >= 1 and "causal_mask" not in counts
    assert counts["attention_grad_q"] == counts["attention_grad_kv"] == counts["attention_core"]


@pytest.mark.parametrize("causal", [False, True])
def test_the_composed_graph_gives_the_interpreters_bits_for_every_attention_op(causal):
    """graph/passes/decomposed.py writes float32 attention ops out as ops.py's formula: the
    interpreter gives the same bits for the graph and its composition, forward and cotangents."""
    from sexpgpu.graph.core.ops import OPS
    from sexpgpu.graph.passes.decomposed import composed_attention

    rng = np.random.default_rng(9)
    shapes = {"q": (2, 3, 6, 4), "k": (2, 3, 6, 4), "v": (2, 3, 6, 5), "g": (2, 3, 6, 5)}
    e = Emitter()
    inputs = {name: e.input(name, "f32", shape) for name, shape in shapes.items()}
    q, k, v, g = inputs.values()
    attrs = {"scale": 0.5, "causal": causal}
    out = e("attention_core", q, k, v, **attrs)
    graph = e.graph(inputs, {"out": out, "dq": e("attention_grad_q", q, k, v, out, g, **attrs),
                             "dkv": e("attention_grad_kv", q, k, v, out, g, **attrs)})
    composed = composed_attention(graph)
    assert not [node.op for node in composed.nodes if OPS[node.op].kind == "attention"]
    values = {name: random_array(rng, "f32", shape, "normal") for name, shape in shapes.items()}
    want, got = CPU.run(graph, values), CPU.run(composed, values)
    for name in want:
        assert want[name].view(np.uint32).tolist() == got[name].view(np.uint32).tolist(), name


def test_the_composition_makes_each_part_once_for_the_output_and_both_cotangents():
    """P is the forward's, for both cotangents, and dS is shared by dq and dk: one softmax,
    one product by v^T, six products in all (q k^T, P v, g v^T, dS k, dS^T q, P^T g)."""
    from collections import Counter

    from sexpgpu.graph.passes.decomposed import composed_attention

    e = Emitter()
    q, k, v, g = (e.input(name, "f32", (2, 3, 6, 4)) for name in "qkvg")
    attrs = {"scale": 0.5, "causal": True}
    out = e("attention_core", q, k, v, **attrs)
    graph = e.graph({"q": q, "k": k, "v": v, "g": g},
                    {"out": out, "dq": e("attention_grad_q", q, k, v, out, g, **attrs),
                     "dkv": e("attention_grad_kv", q, k, v, out, g, **attrs)})
    ops = Counter(node.op for node in composed_attention(graph).nodes)
    assert (ops["softmax"], ops["matmul"], ops["causal_mask"]) == (1, 6, 1)
    # another scale is another attention: nothing is shared with it
    other = e("attention_core", q, k, v, scale=0.25, causal=True)
    graph = e.graph({"q": q, "k": k, "v": v}, {"a": out, "b": other})
    assert Counter(node.op for node in composed_attention(graph).nodes)["softmax"] == 2


def test_a_graph_without_float32_attention_is_kept_as_it_is():
    from sexpgpu.graph.passes.decomposed import composed_attention

    e = Emitter()
    x = e.input("x", "f32", (2, 3))
    graph = e.graph({"x": x}, {"y": e("exp", x)})
    assert composed_attention(graph) is graph
