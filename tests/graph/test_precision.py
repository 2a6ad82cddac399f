"""`:precision bf16` (graph/passes/precision.py), op by op, against plain PyTorch in float64.

For each product the table names, the rewritten graph reads bf16 operands and gives a bf16
result widened to float32; the interpreter's values equal float64 arithmetic on operands
rounded by torch's own `.to(torch.bfloat16)` (round to nearest even), rounded once more to
bf16. The operands are drawn from +-[1, 2) and each output sums at most four terms, so every
sum is exact in float32 and float64 alike: the only roundings are the bf16 ones, and the
comparison is bit for bit. Ties are among the operands, to check ties go to even."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.graph.core.emit import Emitter  # noqa: E402
from sexpgpu.graph.core.ops import OPS  # noqa: E402
from sexpgpu.graph.core.ops import MOVES, PRODUCT  # noqa: E402
from sexpgpu.graph.passes.precision import with_precision  # noqa: E402

CPU = Interpreter()
POLICIES = {name: op.precision for name, op in OPS.items() if op.kind != "exact"}  # the language writes no exact-only op
TIES = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1.5 + 2**-8], dtype=np.float32)  # halfway between bf16s


def operand(rng, shape) -> np.ndarray:
    values = (rng.uniform(1, 2, size=shape) * rng.choice([-1, 1], size=shape)).astype(np.float32)
    flat = values.reshape(-1)
    flat[: len(TIES)] = TIES[: flat.size]
    return values


def bf16(array) -> torch.Tensor:
    """The oracle's rounding: torch's float -> bfloat16, read back as float64."""
    return torch.from_numpy(np.asarray(array, dtype=np.float32)).to(torch.bfloat16).to(torch.float64)


def conv_input_grad(g, w, shape):
    return torch.nn.grad.conv2d_input(shape, w, g)


def conv_weight_grad(x, g, shape):
    return torch.nn.grad.conv2d_weight(x, shape, g)


# op -> (operand shapes, attrs, the float64 oracle on bf16-rounded operands)
PRODUCT_CASES = {
    "matmul": (((3, 4), (4, 2)), {}, lambda a, b: a @ b),
    "conv2d": (((1, 1, 3, 3), (2, 1, 2, 2)), {}, lambda x, w: torch.nn.functional.conv2d(x, w)),
    "conv2d_input_grad": (((1, 2, 2, 2), (2, 1, 2, 2)), {"input_shape": (1, 1, 3, 3)},
                          lambda g, w: conv_input_grad(g, w, (1, 1, 3, 3))),
    "conv2d_weight_grad": (((1, 1, 3, 3), (1, 2, 2, 2)), {"weight_shape": (2, 1, 2, 2)},
                           lambda x, g: conv_weight_grad(x, g, (2, 1, 2, 2))),
}


def rewritten(op: str, shapes, attrs: dict, after=None):
    """(graph of `op` on f32 inputs a, b, then `after` on its result, rewritten for bf16)."""
    e = Emitter()
    inputs = {name: e.input(name, "f32", shape) for name, shape in zip("ab", shapes)}
    result = e(op, *inputs.values(), **attrs)
    if after is not None:
        result = after(e, result)
    (result,) = with_precision(e, "bf16", [result])
    return e.graph(inputs, {"out": result})


def test_every_op_has_a_policy_on_its_definition_and_the_products_are_the_four_contractions():
    assert all(policy is not None for policy in POLICIES.values())
    assert {op for op, policy in POLICIES.items() if policy is PRODUCT} == set(PRODUCT_CASES)


@pytest.mark.parametrize("op", sorted(PRODUCT_CASES))
def test_a_product_reads_bf16_sums_exactly_and_rounds_once_to_bf16(op):
    shapes, attrs, oracle = PRODUCT_CASES[op]
    graph = rewritten(op, shapes, attrs)
    (product,) = [node for node in graph.nodes if node.op == op]
    assert product.dtype == "bf16" and all(source.op == "cast" and source.dtype == "bf16" for source in product.inputs)
    out = graph.outputs["out"]
    assert out.op == "cast" and out.dtype == "f32" and out.inputs[0] is product
    rng = np.random.default_rng(12)
    values = {name: operand(rng, shape) for name, shape in zip("ab", shapes)}
    want = oracle(*(bf16(values[name]) for name in "ab")).to(torch.bfloat16).to(torch.float32).numpy()
    got = CPU.run(graph, values)["out"]
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_without_the_rewrite_the_same_product_does_not_round():
    # the check above can fail: in float32 the product keeps bits bf16 drops
    shapes, attrs, oracle = PRODUCT_CASES["matmul"]
    e = Emitter()
    a, b = e.input("a", "f32", shapes[0]), e.input("b", "f32", shapes[1])
    graph = e.graph({"a": a, "b": b}, {"out": e("matmul", a, b)})
    values = {name: operand(np.random.default_rng(12), shape) for name, shape in zip("ab", shapes)}
    rounded = oracle(bf16(values["a"]), bf16(values["b"])).to(torch.bfloat16).to(torch.float32).numpy()
    assert not np.array_equal(CPU.run(graph, values)["out"], rounded)


# float32 ops that read a product: op -> (build on the widened product, float64 oracle)
FLOAT32_READERS = {
    "softmax": (lambda e, x: e("softmax", x, axis=1), lambda x: torch.softmax(x, 1)),
    "log_softmax": (lambda e, x: e("log_softmax", x, axis=1), lambda x: torch.log_softmax(x, 1)),
    "layernorm": (lambda e, x: e("layernorm", x, eps=1e-5),
                  lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-5)),
    "sum": (lambda e, x: e("sum", x, axes=(1,), keep=False), lambda x: x.sum(1)),
    "max": (lambda e, x: e("max", x, axes=(0,), keep=False), lambda x: x.amax(0)),
    "tanh": (lambda e, x: e("tanh", x), torch.tanh),
    "add": (lambda e, x: e("add", x, x), lambda x: x + x),
}


@pytest.mark.parametrize("op", sorted(FLOAT32_READERS))
def test_readers_of_a_product_compute_in_float32_on_its_bf16_value(op):
    build, oracle = FLOAT32_READERS[op]
    shapes = ((3, 4), (4, 5))
    graph = rewritten("matmul", shapes, {}, build)
    out = graph.outputs["out"]
    assert out.dtype == "f32" and POLICIES[out.op] is not PRODUCT
    assert all(node.dtype != "bf16" for node in graph.nodes if node.op not in ("cast", "matmul"))
    values = {name: operand(np.random.default_rng(3), shape) for name, shape in zip("ab", shapes)}
    product = (bf16(values["a"]) @ bf16(values["b"])).to(torch.bfloat16).to(torch.float64)
    want = oracle(product).numpy()
    got = CPU.run(graph, values)["out"]
    np.testing.assert_allclose(got, want, rtol=4e-7, atol=4e-7)


def test_each_product_casts_its_own_operands_so_their_cotangents_sum_in_float32():
    e = Emitter()
    x, w = e.input("x", "f32", (2, 3)), e.input("w", "f32", (3, 3))
    h = e("matmul", x, w)
    out = e("add", e("matmul", h, w), e("matmul", x, w))
    (out,) = with_precision(e, "bf16", [out])
    graph = e.graph({"x": x, "w": w}, {"out": out})
    products = [node for node in graph.nodes if node.op == "matmul"]
    operands = [source for product in products for source in product.inputs]
    assert all(source.op == "cast" and source.dtype == "bf16" for source in operands)
    assert len({id(source) for source in operands}) == 6  # one cast a read: each bf16 value has one reader
    assert operands[2].inputs[0].inputs[0] is products[0]  # h's bf16 value, widened, then cast again
    from sexpgpu.graph.training.autodiff import gradients

    grads = gradients(e, out, [x, w])
    assert not any(node.op == "add" and node.dtype == "bf16" for node in e.nodes)
    assert [grad.dtype for grad in grads] == ["f32", "f32"]


def test_f32_leaves_the_graph_as_it_is_and_explicit_bf16_nodes_stay():
    e = Emitter()
    x, w = e.input("x", "f32", (2, 3)), e.input("w", "bf16", (3, 3))
    out = e("matmul", e("cast", x, dtype="bf16"), w)
    before = list(e.nodes)
    assert with_precision(e, "f32", [out]) == [out] and e.nodes == before
    assert with_precision(e, "bf16", [out]) == [out] and e.nodes == before


def test_the_table_in_docs_language_md_is_the_policy_table():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text()
    section = text[text.index("### PRECISION"):text.index("## Selecting a run")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {}
    for row in rows:
        ops, policy = row.strip("|").split("|")
        kind = "product" if policy.strip().startswith("product") else "float32"
        documented.update({op: kind for op in re.findall(r"`(\w+)`", ops)})
    assert documented == {op: policy.kind for op, policy in POLICIES.items()}


def test_parameters_their_gradients_and_the_update_stay_float32():
    from dataclasses import replace
    from pathlib import Path

    from sexpgpu.graph.training.program import compile_program
    from sexpgpu.lang.forms import load_experiment

    experiment = load_experiment(str(Path(__file__).resolve().parents[2] / "examples" / "tiny-adam.sexp"))
    programs = {}
    for precision in ("f32", "bf16"):
        run = replace(experiment.run, precision=precision)
        chosen = replace(experiment, runs={**experiment.runs, run.name: run})
        programs[precision] = compile_program(chosen, {"x": ((2,), "f32"), "y": ((), "i32")})
    f32, bf16 = (programs[precision].training for precision in ("f32", "bf16"))
    assert all(node.dtype == "f32" for name, node in bf16.micro.inputs.items() if name.startswith("param/"))
    assert all(node.dtype == "f32" for name, node in bf16.micro.outputs.items())
    assert bf16.update.dump() == f32.update.dump()
    assert not any(node.dtype == "bf16" for node in f32.micro.nodes)
    assert {node.dtype for node in bf16.micro.nodes if node.op == "matmul"} == {"bf16"}
    assert all(node.dtype == "f32" for graph in programs["bf16"].passes.values() for node in graph.outputs.values())
    assert any(node.dtype == "bf16" for node in programs["bf16"].passes["eval"].nodes)


class _RoundBoth(torch.autograd.Function):
    """bf16 rounding in both directions: what a cast to bf16 feeding a product does forward,
    and what the bf16 product of the backward gives the cotangent."""

    @staticmethod
    def forward(ctx, t):
        return t.to(torch.bfloat16).to(t.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


def _oracle_mlp(params: dict, x: np.ndarray, y: np.ndarray, bf16_products: bool) -> dict:
    """tiny-adam's model and mean cross-entropy in float64 autograd, each linear's product in
    bf16 (operands, result and the cotangents of the backward products rounded) or exact."""
    rounded = _RoundBoth.apply if bf16_products else (lambda t: t)
    leaves = {path: torch.tensor(value, dtype=torch.float64, requires_grad=True) for path, value in params.items()}

    def linear(h, name):
        return rounded(rounded(h) @ rounded(leaves[f"{name}/w"].T)) + leaves[f"{name}/b"]

    h = torch.from_numpy(x).to(torch.float64)
    h = linear(torch.relu(linear(torch.relu(linear(h, "fc1")), "fc2")), "head")
    loss = torch.nn.functional.cross_entropy(h, torch.from_numpy(y).long())
    loss.backward()
    return {"loss": loss.detach().numpy(), **{f"grad/{path}": leaf.grad.numpy() for path, leaf in leaves.items()}}


def test_tiny_adams_bf16_loss_and_gradients_are_torch_float64_with_bf16_products():
    """The whole rewritten microbatch graph, backward included, against float64 autograd that
    rounds at the same points; float32 sums are the only other difference, so ours is far
    closer to that oracle than the float32 graph is (which misses every bf16 rounding)."""
    from dataclasses import replace
    from pathlib import Path

    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.setup import build_run

    experiment = load_experiment(str(Path(__file__).resolve().parents[2] / "examples" / "tiny-adam.sexp"))
    outputs = {}
    for precision in ("f32", "bf16"):
        run = replace(experiment.run, precision=precision)
        built = build_run(replace(experiment, runs={**experiment.runs, run.name: run}), "cpu")
        params = built.initial_state().params
        batch = built.feeder.train_batch(1, 0)
        values = {f"param/{path}": value for path, value in params.items()}
        values.update(batch)
        micro = built.program.training.micro
        outputs[precision] = CPU.run(micro, {name: values[name] for name in micro.inputs})
    oracle = _oracle_mlp(params, batch["field/x"], batch["field/y"], bf16_products=True)

    def distance(got: dict, name: str) -> float:
        return float(np.linalg.norm(got[name] - oracle[name]) / np.linalg.norm(oracle[name]))

    for name in oracle:
        ours, plain = distance(outputs["bf16"], name), distance(outputs["f32"], name)
        assert ours <= 1e-6 and ours * 100 < plain, (name, ours, plain)


@pytest.mark.parametrize("name", ["char-lm.sexp", "cnn.sexp"])
def test_every_node_of_a_whole_bf16_microbatch_graph_follows_its_policy(name):
    """Products read and give bf16; what moves values keeps its input's dtype; the only other
    bf16 nodes are the casts; parameters' gradients are float32."""
    from dataclasses import replace
    from pathlib import Path

    from sexpgpu.graph.training.program import compile_program
    from sexpgpu.lang.forms import load_experiment

    experiment = load_experiment(str(Path(__file__).resolve().parents[2] / "examples" / name))
    run = replace(experiment.run, precision="bf16")
    micro = compile_program(replace(experiment, runs={**experiment.runs, run.name: run})).training.micro
    counts = {"product": 0, "cast": 0}
    for node in micro.nodes:
        if POLICIES[node.op].kind == "product":
            assert node.dtype == "bf16" and {source.dtype for source in node.inputs} == {"bf16"}, node
            counts["product"] += 1
        elif node.op == "cast":
            counts["cast"] += node.dtype == "bf16"
        elif POLICIES[node.op] is MOVES and node.inputs and node.op not in ("gather", "scatter_add", "one_hot"):
            assert node.dtype == node.inputs[-1].dtype, node
        else:
            assert node.dtype != "bf16", node
    assert counts["product"] > 0 and counts["cast"] > 0
    assert all(node.dtype == "f32" for out, node in micro.outputs.items())
