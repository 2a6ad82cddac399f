"""The CPU interpreter: kernels against float64 references, bf16 rounding against torch,
input checks, repeatable bits, and draws."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch

from sexpgpu import numerics as nx
from sexpgpu.backends.cpu import Interpreter, interpreter
from sexpgpu.backends.cpu.op_kernels import compile_kernel
from sexpgpu.backends.cpu.arith import round_bf16
from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.plan.memory import lifetimes

NUMERICS = ("exp", "log", "tanh", "erf", "rsqrt", "sigmoid", "pow", "stream_key", "fold_in", "normal", "bernoulli")
needs_numerics = pytest.mark.skipif(
    not all(hasattr(nx, name) for name in NUMERICS), reason="sexpgpu.numerics is not built yet"
)


def _run_one(op: str, arrays: list, dtypes: list | None = None, **attrs):
    e = Emitter()
    dtypes = dtypes or ["f32"] * len(arrays)
    nodes = [e.input(f"x{i}", dtype, np.shape(array)) for i, (dtype, array) in enumerate(zip(dtypes, arrays))]
    y = e(op, *nodes, **attrs)
    graph = e.graph({f"x{i}": node for i, node in enumerate(nodes)}, {"y": y})
    return Interpreter().run(graph, {f"x{i}": array for i, array in enumerate(arrays)})["y"]


# --- bf16 -------------------------------------------------------------------------------------


def test_bf16_rounding_matches_torch_bit_for_bit():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00008000,
                         0x7F800000, 0xFF800000, 0x80000000, 0x00000001], np.uint32)
    values = np.concatenate([bits, specials]).view(np.float32)
    finite = ~np.isnan(values)
    ours = round_bf16(values)
    theirs = torch.from_numpy(values.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(ours[finite].view(np.uint32), theirs[finite].view(np.uint32))
    assert np.isnan(ours[~finite]).all()


def test_bf16_nodes_hold_bfloat16_values():
    x = np.array([1.00390625, 1.01171875, 3.14159265, -2.7182817], np.float32)  # ties round to even
    y = _run_one("cast", [x], dtype="bf16")
    assert np.array_equal(y, round_bf16(x))
    assert list(y[:2]) == [1.0, 1.015625]
    summed = _run_one("add", [y, y], dtypes=["bf16", "bf16"])
    assert np.array_equal(summed, round_bf16(y + y))


def test_a_bf16_scalar_stays_a_scalar():
    """A bf16 sum over every axis is 0-d, rounding it to bf16 keeps it 0-d, and a 0-d bf16
    input is accepted (numpy's ascontiguousarray once made each of them 1-d)."""
    total = _run_one("sum", [np.array([1.5, 2.25, 3.0], np.float32)], dtypes=["bf16"], axes=None)
    assert total.shape == () and float(total) == 6.75
    assert round_bf16(np.float32(1.00390625)).shape == ()
    doubled = _run_one("add", [np.array(1.5, np.float32)] * 2, dtypes=["bf16", "bf16"])  # a 0-d bf16 input
    assert doubled.shape == () and float(doubled) == 3.0


@pytest.mark.parametrize("op", ["exp", "log", "tanh", "erf", "sigmoid", "rsqrt"])
def test_a_function_of_a_scalar_is_a_scalar(op):
    """The portable functions once returned a 0-d value 1-d, which a transpose then refused."""
    e = Emitter()
    x = e.input("x", "bf16", ())
    y = e("transpose", e(op, x), perm=())
    graph = e.graph({"x": x}, {"y": y, "z": e(op, x)})
    out = Interpreter().run(graph, {"x": np.array(1.0, np.float32)})
    assert out["y"].shape == () and out["z"].shape == ()


def test_cast_to_i32_truncates_and_saturates():
    x = np.array([2.7, -2.7, np.nan, 1e20, -1e20, 0.5], np.float32)
    assert list(_run_one("cast", [x], dtype="i32")) == [2, -2, 0, 2**31 - 128, -(2**31), 0]


# --- kernels against references ---------------------------------------------------------------


@needs_numerics
@pytest.mark.parametrize("op, reference", [
    ("softmax", lambda t: torch.softmax(t, -1)),
    ("log_softmax", lambda t: torch.log_softmax(t, -1)),
    ("gelu", lambda t: torch.nn.functional.gelu(t)),
    ("tanh", torch.tanh), ("exp", torch.exp), ("sigmoid", torch.sigmoid), ("erf", torch.erf),
])
def test_float_kernels_match_float64_torch(op, reference):
    x = (np.random.default_rng(2).standard_normal((6, 9)) * 3).astype(np.float32)
    attrs = {"axis": -1} if "softmax" in op else {}
    ours = _run_one(op, [x], **attrs)
    expected = reference(torch.from_numpy(x).double()).numpy()
    np.testing.assert_allclose(ours, expected, rtol=4e-6, atol=2e-7)


@needs_numerics
def test_layernorm_and_cross_entropy_match_float64_torch():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 7)).astype(np.float32) * 2 + 1
    ours = _run_one("layernorm", [x], eps=1e-5)
    expected = torch.nn.functional.layer_norm(torch.from_numpy(x).double(), (7,), eps=1e-5).numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    labels = rng.integers(0, 7, 4).astype(np.int32)
    losses = _run_one("cross_entropy", [x, labels], dtypes=["f32", "i32"])
    expected = torch.nn.functional.cross_entropy(torch.from_numpy(x).double(), torch.from_numpy(labels).long(),
                                                 reduction="none").numpy()
    np.testing.assert_allclose(losses, expected, rtol=1e-6, atol=1e-6)


def test_gather_scatter_and_one_hot():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    ids = np.array([[3, 0], [3, 3]], np.int32)
    assert np.array_equal(_run_one("gather", [table, ids], dtypes=["f32", "i32"]), table[ids])
    values = np.array([[1e8, 1, 1], [1, 1, 1], [-1e8, 1, 1]], np.float32)
    rows = _run_one("scatter_add", [np.array([2, 2, 2], np.int32), values], dtypes=["i32", "f32"], rows=3)
    # row 2 folds 1e8 + 1 (rounds to 1e8), then - 1e8: 0, not 1 as another order could give
    assert list(rows[2]) == [0.0, 3.0, 3.0] and not rows[:2].any()
    hot = _run_one("one_hot", [np.array([1, 0], np.int32)], dtypes=["i32"], depth=3, dtype="f32")
    assert np.array_equal(hot, [[0, 1, 0], [1, 0, 0]])


def test_ids_out_of_range_are_a_clear_error():
    table = np.zeros((4, 3), np.float32)
    with pytest.raises(SexpgpuError) as caught:
        _run_one("gather", [table, np.array([1, 4], np.int32)], dtypes=["f32", "i32"])
    assert caught.value.code == "E-INDEX-001" and "4 is outside 0..3" in caught.value.message


def test_argmax_takes_the_first_of_equal_maxima():
    x = np.array([[1, 3, 3], [2, 2, 0]], np.float32)
    assert list(_run_one("argmax", [x], axis=1)) == [1, 0]


def test_movement_ops():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert np.array_equal(_run_one("transpose", [x], perm=(2, 0, 1)), x.transpose(2, 0, 1))
    assert np.array_equal(_run_one("slice", [x], axis=2, start=1, stop=3), x[:, :, 1:3])
    assert np.array_equal(_run_one("pad", [x], axis=0, before=1, after=0)[1:], x)
    assert np.array_equal(_run_one("broadcast", [x[:, :1, :]], shape=(5, 2, 3, 4))[4], np.repeat(x[:, :1], 3, 1))
    assert np.array_equal(_run_one("concat", [x, x], axis=1), np.concatenate([x, x], 1))


# --- inputs, outputs, repeatability --------------------------------------------------------------


def _tiny_graph():
    e = Emitter()
    x, w = e.input("x", "f32", (2, 3)), e.input("w", "bf16", (3,))
    y = e("mul", x, e("cast", w, dtype="f32"))
    return e.graph({"x": x, "w": w}, {"y": y, "x": x})


def test_inputs_are_checked_and_never_cast_silently():
    graph, interpreter = _tiny_graph(), Interpreter()
    good = {"x": np.ones((2, 3), np.float32), "w": np.ones(3, np.float32)}
    with pytest.raises(ValueError, match="missing"):
        interpreter.run(graph, {"x": good["x"]})
    with pytest.raises(ValueError, match="not inputs"):
        interpreter.run(graph, {**good, "z": 1})
    with pytest.raises(TypeError, match="float64"):
        interpreter.run(graph, {**good, "x": np.ones((2, 3))})
    with pytest.raises(ValueError, match="shape"):
        interpreter.run(graph, {**good, "x": np.ones((3, 2), np.float32)})
    with pytest.raises(ValueError, match="not bfloat16"):
        interpreter.run(graph, {**good, "w": np.full(3, 1.001, np.float32)})


def test_outputs_are_fresh_arrays():
    graph = _tiny_graph()
    x = np.ones((2, 3), np.float32)
    out = Interpreter().run(graph, {"x": x, "w": np.ones(3, np.float32)})
    out["x"][0, 0] = 5
    assert x[0, 0] == 1


def test_it_holds_each_value_for_the_lifetime_the_memory_plan_gives_it(monkeypatch):
    """One liveness (plan/memory.py): while step i runs, the intermediate values alive are
    those made before i and read at i or later, no more (each is dropped after its last reader)."""
    e = Emitter()
    x = e.input("x", "f32", (4,))
    a = e("neg", x)  # not exp: the memo shares what exp returns, and keeps it alive itself
    b = e("add", a, x)
    c = e("mul", b, b)
    d = e("sub", c, a)
    graph = e.graph({"x": x}, {"y": e("mul", d, c)})
    made, alive = {}, {}  # position -> a weak reference to its value; step -> positions alive

    def watched(node, math):
        kernel, index = compile_kernel(node, math), graph.nodes.index(node)

        def run(args):
            alive[index] = {at for at, ref in made.items() if ref() is not None}
            value = kernel(args)
            made[index] = weakref.ref(value)
            return value

        return run

    monkeypatch.setattr(interpreter, "compile_kernel", watched)
    Interpreter().run(graph, {"x": np.ones(4, np.float32)})
    spans = lifetimes(graph)
    assert alive == {step: {at for at in made if spans[at][0] < step <= spans[at][1]} for step in alive}
    assert alive[4] == {1, 3}  # at d = c - a: a (read last here) and c (read again by y); b is gone


@needs_numerics
def test_a_bigger_graph_gives_the_same_bits_twice():
    from graph_cases import small_transformer_step

    first = small_transformer_step(Interpreter())
    second = small_transformer_step(Interpreter())
    assert first.keys() == second.keys()
    for name in first:
        assert first[name].tobytes() == second[name].tobytes(), name


# --- draws --------------------------------------------------------------------------------------------


def _draw_graph(op="normal", shape=(4, 3), salts=(), field_shape=None, **params):
    e = Emitter()
    inputs = {}
    sources = []
    for salt in salts:
        node = e.input(salt, "i32", field_shape if salt.startswith("field/") else ())
        inputs[salt] = node
        sources.append(node)
    y = e(op, *sources, shape=shape, seed=11, stream="block0/dropout#0", salts=tuple(salts), **params)
    return e.graph(inputs, {"y": y})


@needs_numerics
def test_draws_are_functions_of_seed_stream_and_salt():
    interpreter = Interpreter()
    plain = _draw_graph(mean=0.0, std=1.0)
    first, again = (interpreter.run(plain, {})["y"] for _ in range(2))
    assert first.tobytes() == again.tobytes()
    expected = nx.normal(nx.stream_key(11, "block0/dropout#0"), (4, 3), 0.0, 1.0)
    assert first.tobytes() == np.asarray(expected, np.float32).tobytes()
    salted = _draw_graph(salts=("step",), mean=0.0, std=1.0)
    step3 = interpreter.run(salted, {"step": 3})["y"]
    step4 = interpreter.run(salted, {"step": 4})["y"]
    key3 = nx.fold_in(nx.stream_key(11, "block0/dropout#0"), 3)
    assert step3.tobytes() == np.asarray(nx.normal(key3, (4, 3), 0.0, 1.0), np.float32).tobytes()
    assert step3.tobytes() != step4.tobytes()


@needs_numerics
def test_a_field_salt_draws_each_row_from_its_own_record_key():
    graph = _draw_graph(op="bernoulli", shape=(3, 50), salts=("step", "field/id"), field_shape=(3,), p=0.5)
    ids = np.array([7, 7, 2], np.int32)
    rows = Interpreter().run(graph, {"step": 5, "field/id": ids})["y"]
    assert rows.dtype == np.bool_
    assert np.array_equal(rows[0], rows[1]) and not np.array_equal(rows[0], rows[2])
    key = nx.fold_in(nx.fold_in(nx.stream_key(11, "block0/dropout#0"), 5), 2)
    assert np.array_equal(rows[2], nx.bernoulli(key, (50,), 0.5))
