"""What the graph stage builds: parameter paths, draw streams, graph inputs, generators."""

from __future__ import annotations

import numpy as np
import pytest

from graph_helpers import experiment, expression_graph
from sexpgpu import numerics as nx
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.graph import compile_program, field_specs_of_generator

SPECS = {"x": ((4,), "f32"), "y": ((), "i32"), "id": ((), "i32")}

NESTED = """
(defgraph inner (x) :width 4
  (let h (linear x :out width :as fc))
  (dropout (tanh h) :p 0.25 :salt (:step (field id))))

(defgraph encoder (x) :width 4
  (let h (repeat 2 inner x :as block :width width))
  (add h (mul (param scale (width) :init ones) (dropout h :p 0.1))))

(defgraph net (x)
  (let h (encoder x :as encoder))
  (let noise (normal (batch 4) :std 0.01))
  (linear (add h noise) :out 3 :as head :init (normal :std 0.5)))

(defrun r :seed 9 :data (records "d.npz") :model (net x) :loss (cross-entropy y)
  :optimizer (adam :lr 0.01) :batch 2 :steps 1 :passes ((eval :every 1) (eval :every 2 :name held)))
"""


def _draws(graph) -> list:
    return [node.attrs["stream"] for node in graph.nodes if "stream" in node.attrs]


def test_parameter_paths_follow_scopes_and_repeat():
    program = compile_program(experiment(NESTED), SPECS)
    assert list(program.params) == [
        "encoder/block0/fc/b", "encoder/block0/fc/w", "encoder/block1/fc/b", "encoder/block1/fc/w",
        "encoder/scale", "head/b", "head/w",
    ]
    head = program.params["head/w"]
    assert head.shape == (3, 4) and head.dtype == "f32" and head.load is None
    assert head.init.name == "normal" and dict(head.init.params) == {"mean": 0.0, "std": 0.5}
    assert program.params["encoder/block0/fc/w"].init.name == "glorot-uniform"
    assert program.params["encoder/scale"].init.name == "ones"


def test_model_draw_streams_are_scope_op_ordinal():
    program = compile_program(experiment(NESTED), SPECS)
    assert _draws(program.training.micro) == [
        "encoder/block0/dropout#0", "encoder/block1/dropout#0", "encoder/dropout#0", "normal#0",
    ]
    micro_dropouts = [node for node in program.training.micro.nodes if node.op == "bernoulli"]
    assert micro_dropouts[0].attrs["salts"] == ("step", "field/id") and micro_dropouts[0].attrs["seed"] == 9
    assert [node.attrs["p"] for node in micro_dropouts] == [0.75, 0.75, 0.9]


def test_passes_have_no_dropout_and_key_their_draws_by_pass():
    program = compile_program(experiment(NESTED), SPECS)
    assert list(program.passes) == ["eval", "held"]
    assert _draws(program.passes["eval"]) == ["eval/draw#0"]
    assert _draws(program.passes["held"]) == ["held/draw#0"]
    assert list(program.passes["eval"].outputs) == ["loss", "metric/accuracy"]
    assert "field/id" not in program.passes["eval"].inputs


def test_graph_inputs_and_outputs_are_in_documented_order():
    program = compile_program(experiment(NESTED), SPECS)
    micro = program.training.micro
    params = [f"param/{path}" for path in program.params]
    assert list(micro.inputs) == params + ["field/id", "field/x", "field/y", "step"]
    assert list(micro.outputs) == ["loss"] + [f"grad/{path}" for path in program.params]
    update = program.training.update
    grads = [f"grad/{path}" for path in program.params]
    state = [f"state/{slot}/{path}" for slot in ("m", "v") for path in program.params]
    assert list(update.inputs) == params + grads + state + ["step", "lr"]
    assert list(update.outputs) == params + state + ["grad_norm"]
    assert program.training.state == {"m": list(program.params), "v": list(program.params)}
    assert program.training.state_shapes()["state/m/head/w"] == (3, 4)
    assert micro.inputs["field/x"].shape == (2, 4)
    for graph in (micro, update):
        assert graph.nodes[: len(graph.inputs)] == tuple(graph.inputs.values())


def test_field_salts_make_a_run_unstackable():
    assert compile_program(experiment(NESTED), SPECS).stackable is False
    plain = NESTED.replace(":salt (:step (field id))", ":salt :step")
    assert compile_program(experiment(plain), SPECS).stackable is True
    by_microbatch = NESTED.replace(":salt (:step (field id))", ":salt (:microbatch)")
    assert compile_program(experiment(by_microbatch), SPECS).stackable is False


GENERATED = """
(defgenerator teacher :width 3
  (let w (normal (width 2)))
  (let x (normal (batch width) :salt (:step :trip)))
  (record :x x :y (matmul x w) :k (randint (batch) :low 0 :high 5 :salt :microbatch)))

(defgraph net (x) (linear x :out 2 :as fc))

(defrun r :seed 4 :data (generator teacher :width 5) :model (net x) :loss (mse y)
  :optimizer (sgd :lr 0.1) :batch 6 :steps 1 :passes ((eval :every 1 :data (generator teacher) :name other)))
"""


def test_generators_give_field_specs_streams_and_inputs():
    exp = experiment(GENERATED)
    assert field_specs_of_generator(exp) == {"x": ((5,), "f32"), "y": ((2,), "f32"), "k": ((), "i32")}
    program = compile_program(exp)
    generator = program.generator
    assert list(generator.inputs) == ["step", "microbatch", "trip"]
    assert list(generator.outputs) == ["field/x", "field/y", "field/k"]
    assert _draws(generator) == ["teacher/draw#0", "teacher/draw#1", "teacher/draw#2"]
    assert program.stackable is False  # the generator reads :microbatch
    assert program.training.micro.inputs["field/x"].shape == (6, 5)
    other = program.pass_generators["other"]
    assert other.outputs["field/x"].shape == (6, 3)  # the pass's call keeps the default width


def test_layers_compute_their_documented_formulas():
    text = """
(defgraph net (x)
  (let h (layernorm (linear x :out 3 :as fc) :as norm :eps 0.001))
  (let ids (reshape (cast (slice x :axis 1 :start 0 :stop 1) i32) (batch)))
  (sum (mul h (embedding ids :vocab 7 :dim 3 :as emb)) :axis 1 :keep true))
(defrun r :seed 1 :data (records "d.npz") :model (net x) :loss (mse y)
  :optimizer (sgd :lr 0.1) :batch 2 :steps 1)
"""
    program = compile_program(experiment(text), {"x": ((4,), "f32"), "y": ((1,), "f32")})
    rng = np.random.default_rng(0)
    params = {path: rng.standard_normal(spec.shape) for path, spec in program.params.items()}
    x = np.array([[2.0, 1, -1, 0.5], [5.0, 0, 2, 1]])
    y = np.array([[0.5], [-1.0]])
    feed = {f"param/{path}": value for path, value in params.items()}
    feed.update({"field/x": x, "field/y": y})
    loss = Interpreter("f64").run(program.training.micro, feed)["loss"]
    hidden = x @ params["fc/w"].T + params["fc/b"]
    centered = hidden - hidden.mean(-1, keepdims=True)
    normed = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 0.001)
    normed = normed * params["norm/gain"] + params["norm/bias"]
    rows = params["emb/table"][x[:, 0].astype(int)]
    prediction = (normed * rows).sum(1, keepdims=True)
    np.testing.assert_allclose(loss, ((prediction - y) ** 2).mean(), rtol=1e-12)


def test_a_path_declared_twice_alike_is_one_shared_parameter():
    text = """
(defgraph net (x)
  (let a (mul x (param w (4) :init ones)))
  (add a (param w (4) :init ones)))
(defrun r :seed 1 :data (records "d.npz") :model (net x) :loss (mse x)
  :optimizer (sgd :lr 0.1) :batch 2 :steps 1)
"""
    program = compile_program(experiment(text), {"x": ((4,), "f32")})
    assert list(program.params) == ["w"]


def test_layers_on_bf16_inputs_keep_float32_parameters_and_cast_them():
    text = """
(defgraph net (x) (cast (linear (cast x bf16) :out 2 :as fc) f32))
(defrun r :seed 1 :data (records "d.npz") :model (net x) :loss (mse y)
  :optimizer (sgd :lr 0.1) :batch 2 :steps 1)
"""
    program = compile_program(experiment(text), {"x": ((4,), "f32"), "y": ((2,), "f32")})
    assert {spec.dtype for spec in program.params.values()} == {"f32"}
    casts = [node for node in program.training.micro.nodes if node.op == "cast" and node.dtype == "bf16"]
    assert len(casts) >= 3  # x, w and b
    assert all(node.dtype == "f32" for name, node in program.training.micro.outputs.items())


@pytest.mark.skipif(not hasattr(nx, "erf"), reason="sexpgpu.numerics is not built yet")
def test_the_language_gelu_gives_the_bits_of_the_gelu_op():
    from sexpgpu.graph.core.emit import Emitter

    x = (np.random.default_rng(1).standard_normal(1000) * 3).astype(np.float32)
    composed = Interpreter().run(expression_graph("(gelu x)", {"x": ((1000,), "f32")}), {"x": x})["y"]
    e = Emitter()
    node = e.input("x", "f32", (1000,))
    single = Interpreter().run(e.graph({"x": node}, {"y": e("gelu", node)}), {"x": x})["y"]
    assert composed.tobytes() == single.tobytes()
