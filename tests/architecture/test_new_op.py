"""An op added by a test, through the public registration calls only, works end to end:
`softplus(x) = log(1 + exp(x))`, its shape rule, gradient and precision policy in its OpDef
(graph/core/ops.py `define`), its CPU kernel (backends/cpu/op_kernels.py `KERNELS`), its CUDA
expression (backends/cuda/elementwise.py `EXPRESSIONS`, in the portable exp and log), and the
language's name for it (graph/frontend/layers.py `builtin`). It is compiled from an
experiment's text and trained one microbatch by the interpreter, its gradients checked
against float64 finite differences; the CUDA backend, run on CPU tensors by Triton's
interpreter, gives the interpreter's bits. An op defined with no rules is missing from the
tables of those two backend modules and no others. Everything is taken back afterwards.
These are the places docs/architecture.md's "Adding an op" lists."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from op_cases import case_graph
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.backends.cpu.op_kernels import KERNELS
from sexpgpu.backends.cuda.codegen.expr import unary as expression
from sexpgpu.backends.cuda.elementwise import EXPRESSIONS
from sexpgpu.graph import compile_program
from sexpgpu.graph.core.ops import ARITHMETIC, OPS, OpDef, define, elementwise, undefine
from sexpgpu.graph.core.rules import TABLES, RuleTable
from sexpgpu.graph.frontend.layers import BUILTINS, builtin, unary
from sexpgpu.lang.forms import parse_experiment, select_run
from sexpgpu.lang.reader import read_text
from test_op_rules import missing_rules, table_modules

TEXT = """
(defgenerator points :width 3
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (tanh x)))

(defgraph model (x) (softplus (linear x :out 3 :as fc)))

(defrun fit :seed 1 :data (generator points) :model (model x) :loss (mse y)
  :optimizer (sgd :lr 0.1) :batch 4 :steps 1)
"""


def _vjp(e, node, g):
    return (e("mul", g, e("sigmoid", node.inputs[0])),)


def _kernel(node, args, m):
    (x,) = args
    return m.log(x.dtype.type(1) + m.exp(x))


def _expression(node, args):
    (x,) = args
    return expression("log", 1.0 + expression("exp", x))  # the kernel's float32 steps, its exp and log


def _definition() -> OpDef:
    return OpDef("softplus", "unary", elementwise("softplus"), _vjp, arity=1, precision=ARITHMETIC)


@pytest.fixture
def softplus():
    define(_definition())
    KERNELS.add("softplus", _kernel)
    EXPRESSIONS.add("softplus", _expression)
    builtin("softplus", ("value",))(unary("softplus"))
    try:
        yield OPS["softplus"]
    finally:
        del BUILTINS["softplus"]
        EXPRESSIONS.remove("softplus")
        KERNELS.remove("softplus")
        undefine("softplus")


# docs/architecture.md's list of the places a new op touches
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ADDING_AN_OP = re.compile(r"### Adding an op\n.*?(?=\n## )", re.S)


def _module_of(table: RuleTable) -> str:
    """The module that makes the table (others may import it)."""
    return next((name for name in table_modules() for variable, value in vars(sys.modules[name]).items()
                 if value is table and re.search(rf"^{variable} = RuleTable\(", Path(sys.modules[name].__file__).read_text(), re.M)),
                table.concern)


def test_its_rules_go_in_the_listed_modules_and_no_others():
    missing_rules()  # every backend module that makes a table, imported
    define(_definition())
    try:
        lacking = {_module_of(table) for table in TABLES if "softplus" in table.missing()}
    finally:
        undefine("softplus")
    assert lacking == {"sexpgpu.backends.cpu.op_kernels", "sexpgpu.backends.cuda.elementwise"}
    listed = ADDING_AN_OP.search(ARCHITECTURE.read_text()).group(0)
    assert all(name.removeprefix("sexpgpu.").replace(".", "/") + ".py" in listed for name in lacking | {"sexpgpu.graph.core.ops"})


def test_with_its_rules_no_table_lacks_it(softplus):
    assert missing_rules() == []


def _loss64(x, y, **params) -> float:
    """mse(softplus(x @ w^T + b), y) in float64."""
    return float(np.mean((np.logaddexp(0.0, x @ params["fc/w"].T + params["fc/b"]) - y) ** 2))


def _experiment():
    return select_run(parse_experiment(read_text(TEXT, "softplus.sexp"), "softplus.sexp", ""), None)


def _micro_and_feed() -> tuple:
    """The experiment's microbatch graph and float32 values for its inputs."""
    micro = compile_program(_experiment()).training.micro
    rng = np.random.default_rng(3)
    values = {"param/fc/w": rng.standard_normal((3, 3)), "param/fc/b": rng.standard_normal(3),
              "field/x": rng.standard_normal((4, 3)), "field/y": np.tanh(rng.standard_normal((4, 3)))}
    feed = {name: np.asarray(value, np.float32) for name, value in values.items()}
    feed.update({name: np.int32(0) for name in micro.inputs if name not in feed})  # step, microbatch
    return micro, feed


def test_an_op_added_through_the_registration_calls_compiles_runs_and_differentiates(softplus):
    micro, feed = _micro_and_feed()
    assert micro.op_counts()["softplus"] == 1
    out = Interpreter().run(micro, feed)
    w, b, x, y = (feed[name].astype(np.float64) for name in ("param/fc/w", "param/fc/b", "field/x", "field/y"))
    assert out["loss"] == pytest.approx(_loss64(x, y, **{"fc/w": w, "fc/b": b}), rel=1e-6)
    params = {"fc/w": w, "fc/b": b}
    for name, param in params.items():
        numeric = np.zeros_like(param)
        for index in np.ndindex(param.shape):
            ends = []
            for shift in (1e-6, -1e-6):
                moved = param.copy()
                moved[index] += shift
                ends.append(_loss64(**{**params, name: moved}, x=x, y=y))
            numeric[index] = (ends[0] - ends[1]) / 2e-6
        np.testing.assert_allclose(out[f"grad/{name}"], numeric, rtol=1e-4, atol=1e-6, err_msg=name)


def _cuda_backend(monkeypatch, interpreted_only: bool = False):
    """The CUDA backend: on CPU tensors under Triton's interpreter (turned on as
    tests/cuda/conftest.py's `interpreted` does), or on the GPU where there is one."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from sexpgpu.backends.cuda.backend import CudaBackend

    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        return CudaBackend(device="cpu")
    if interpreted_only:
        pytest.skip("a GPU's products and sums differ from the interpreter's by rounding")
    return CudaBackend()


def _assert_same_bits(backend, got: dict, want: dict) -> None:
    for name, value in want.items():
        assert backend.to_host(got[name]).view(np.uint32).tolist() == value.view(np.uint32).tolist(), name


def test_the_cuda_backend_runs_the_training_graph_with_the_interpreters_bits(softplus, monkeypatch):
    backend = _cuda_backend(monkeypatch, interpreted_only=True)
    micro, feed = _micro_and_feed()
    _assert_same_bits(backend, backend.run(micro, feed), Interpreter().run(micro, feed))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_its_cuda_expression_gives_the_interpreters_bits(softplus, dtype, monkeypatch):
    """Elementwise, with no sum, in the portable exp and log: bit for bit on any device, its
    gradient too."""
    backend = _cuda_backend(monkeypatch)
    graph, values = case_graph(("softplus", [(dtype, (7, 9), "normal")], {}))
    want = Interpreter().run(graph, values)
    _assert_same_bits(backend, backend.run(graph, values), {name: want[name] for name in ("y", "grad0")})


def test_its_precision_policy_keeps_it_float32_under_bf16(softplus):
    from dataclasses import replace

    experiment = _experiment()
    run = replace(experiment.run, precision="bf16")
    micro = compile_program(replace(experiment, runs={**experiment.runs, run.name: run})).training.micro
    assert [node.dtype for node in micro.nodes if node.op == "softplus"] == ["f32"]
    assert {node.dtype for node in micro.nodes if node.op == "matmul"} == {"bf16"}


def test_taking_it_back_leaves_no_trace(softplus):
    pass  # the fixture's undoing runs after this


def test_nothing_of_softplus_is_left():
    assert "softplus" not in OPS and "softplus" not in BUILTINS
    assert not any("softplus" in table for table in TABLES)
