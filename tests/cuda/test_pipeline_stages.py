"""The CUDA pipeline's first stages, lowering with fusion (`Lowerer.schedule`) and the memory
plan (`arena_plan`), over plain data and without Triton: the cases run in one process where
importing Triton fails, and the tests check what each stage decided and its text form
(`Schedule.dump`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

_PRELUDE = """
import json, sys
sys.modules["triton"] = None  # any import of Triton fails
from sexpgpu.backends.cuda.fusion import FusionPolicy
from sexpgpu.backends.cuda.lowering import Lowerer, arena_plan
from sexpgpu.backends.cuda.launches import launch_text
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.plan.memory import liveness

found = {}

def stages(graph, level="on"):
    schedule = Lowerer(graph, FusionPolicy(level)).schedule()
    return schedule, arena_plan(schedule)
"""


def _run(body: str) -> dict:
    """What the body puts in `found`, run after the prelude in a process without Triton."""
    source = _PRELUDE + body + "\nassert sys.modules['triton'] is None\nprint(json.dumps(found))\n"
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_CASES = """
e = Emitter()
x = e.input("x", "f32", (8, 32))
w = e.input("w", "f32", (32, 16))
h = e("neg", e("matmul", x, w))
graph = e.graph({"x": x, "w": w}, {"p": e("softmax", h), "s": e("sum", e("exp", h), axes=(0,))})
(fused, fused_arena), (unfused, unfused_arena) = stages(graph), stages(graph, "off")
found["mixed"] = {"fused": [type(launch).__name__ for launch in fused.launches],
                  "unfused": [type(launch).__name__ for launch in unfused.launches],
                  "dump": fused.dump(), "arena": [fused_arena.arena_bytes, unfused_arena.arena_bytes],
                  "arena_dump": fused_arena.dump()}

e = Emitter()
x = e.input("x", "f32", (4, 64))
mean = e("div", e("sum", x, axes=(1,)), e("const", value=64.0, dtype="f32", shape=(4,)))
graph = e.graph({"x": x}, {"mean": mean, "top": e("max", x, axes=(1,))})
found["rows"] = [[launch.kind, list(launch.writes)] for launch in stages(graph)[0].launches]

e = Emitter()
x = e.input("x", "f32", (64, 64))
value = x
for _ in range(6):  # each product is a launch of its own, with a buffer of its own
    value = e("matmul", value, x)
schedule, arena = stages(e.graph({"x": x}, {"y": value}))
buffers = schedule.buffers
lives = liveness([(launch.reads, launch.writes) for launch in schedule.launches], lambda key: buffers[key].nbytes)
found["chain"] = {"lives": [[life.key, life.born, life.dies, arena.offsets[life.key], life.nbytes]
                            for life in lives if life.key in arena.offsets], "arena": arena.arena_bytes}

from sexpgpu.backends.cuda.fusion import FusionPolicy

def decided(graph, **policy):
    schedule = Lowerer(graph, FusionPolicy(**policy)).schedule()
    return {"decisions": [str(decision) for decision in schedule.decisions], "dump": schedule.dump(),
            "unfused": [launch.kind for launch in schedule.unfused], "kernels": [launch.kind for launch in schedule.launches]}

e = Emitter()
x = e.input("x", "f32", (8, 32))
chain = e("mul", e("neg", e("exp", x)), x)
found["chain_fuses"] = decided(e.graph({"x": x}, {"s": e("sum", chain, axes=(0,))}))
found["chain_off"] = decided(e.graph({"x": x}, {"s": e("sum", chain, axes=(0,))}), level="off")

e = Emitter()
x = e.input("x", "f32", (8, 32))
shared = e("mul", e("exp", x), e("log", x))  # read by a column sum and a row sum: two kernels
graph = e.graph({"x": x}, {"c": e("sum", shared, axes=(0,)), "r": e("sum", shared, axes=(1,))})
found["budget"] = [decided(graph, budget=budget) for budget in (0.1, 100.0)]

e = Emitter()
x = e.input("x", "f32", (4, 64))
total = e("sum", x, axes=(1,))
y = e.input("y", "f32", (4, 32))
found["other_rows"] = decided(e.graph({"x": x, "y": y}, {"a": e("sum", x, axes=(1,)), "b": e("sum", y, axes=(1,))}))
found["row_merge"] = decided(e.graph({"x": x}, {"top": e("max", x, axes=(1,)), "m": e("mul", total, total)}))

e = Emitter()
x = e.input("x", "f32", (8, 32))
gradient = e("mul", e("exp", x), x)
found["tile_store"] = decided(e.graph({"x": x}, {"c": e("sum", gradient, axes=(0,)), "h": e("neg", gradient)}))
y = e.input("y", "f32", (8, 32))
found["tile_store_unrelated"] = decided(e.graph({"x": x, "y": y}, {"c": e("sum", x, axes=(0,)), "h": e("neg", y)}))

e = Emitter()
logits = e.input("z", "f32", (4, 10))
labels = e.input("y", "i32", (4,))
found["beside"] = decided(e.graph({"z": logits, "y": labels},
                                  {"loss": e("cross_entropy", logits, labels), "p": e("softmax", logits)}))

from sexpgpu.backends.cuda.codegen.expr import load
from sexpgpu.backends.cuda.codegen.space import View, contiguous
from sexpgpu.backends.cuda.fusion import add_output
from sexpgpu.backends.cuda.launches import FlatLaunch

x = load("x", contiguous((4, 8)))
open_kernel = FlatLaunch((4, 8), [("t", contiguous((4, 8)), "f32", x * x)])
joined = [add_output(open_kernel, (4, 8), "a", "f32", load("t", View((4, 8), (1, 4))) + 1.0),  # another view
          add_output(open_kernel, (8, 4), "b", "f32", x * 2.0),  # another space
          add_output(open_kernel, (4, 8), "c", "f32", load("t", contiguous((4, 8))) + 1.0)]
found["legal"] = [kernel is not None for kernel in joined]
found["legal_kernel"] = launch_text(joined[2])
found["legal_open"] = launch_text(open_kernel)  # the open kernel itself is left as it was
"""


@pytest.fixture(scope="module")
def found():
    return _run(_CASES)


def test_the_stages_before_code_generation_run_without_triton_and_say_what_they_decided(found):
    found = found["mixed"]
    # the product is PyTorch's; neg is inlined in the softmax's row kernel and the column sum
    assert found["fused"] == ["TorchLaunch", "RowLaunch", "ColumnLaunch"]
    assert found["unfused"] == ["TorchLaunch", "FlatLaunch", "RowLaunch", "FlatLaunch", "ColumnLaunch"]
    dump = found["dump"]
    assert "launch 1: rows RowLaunch" in dump and "= neg(" in dump and "launch 2: columns ColumnLaunch" in dump
    assert found["arena"][0] < found["arena"][1]  # fewer buffers written out, a smaller arena
    assert found["arena_dump"].startswith(f"arena {found['arena'][0]} bytes\n")


def test_reductions_over_the_same_rows_and_their_readers_join_one_row_kernel(found):
    found = found["rows"]
    assert len(found) == 1 and found[0][0] == "rows"  # the sum, the division's store and the max
    assert len(found[0][1]) == 3


def test_the_arena_gives_buffers_that_live_together_apart_and_reuses_the_rest(found):
    found = found["chain"]
    lives = found["lives"]
    assert len(lives) == 5 and found["arena"] == 2 * 64 * 64 * 4  # two blocks, taken in turn
    for key, born, dies, offset, size in lives:
        for other, born2, dies2, offset2, size2 in lives:
            if key < other and not (dies < born2 or dies2 < born):
                assert offset + size <= offset2 or offset2 + size2 <= offset


def test_an_open_kernel_takes_a_value_of_its_space_that_reads_its_outputs_through_their_own_views(found):
    assert found["legal"] == [False, False, True]
    text = found["legal_kernel"]  # the read of t became t's own expression: x is loaded, t is not
    assert "reads=x writes=t,c" in text and "load ('t'" not in text
    assert "writes=t\n" in found["legal_open"]


def test_lowering_makes_one_launch_per_op_and_a_chain_of_elementwise_ops_fuses_into_its_reader(found):
    found_all, found = found, found["chain_fuses"]
    assert found["unfused"] == found["kernels"] == ["columns"]  # exp, neg and mul are inlined in the sum
    assert found["decisions"][:3] == ["fuse %1 exp: one kernel reads it", "fuse %2 neg: one kernel reads it",
                                      "fuse %3 mul: one kernel reads it"]
    assert "fuse %1 exp: one kernel reads it" in found["dump"]
    off = found_all["chain_off"]  # unfused: every value written out, and no kernel joins another
    assert off["unfused"] == off["kernels"] == ["elementwise", "elementwise", "elementwise", "columns"]
    assert all(decision.startswith("apart") for decision in off["decisions"])
    assert "apart %1 exp: fusion is off" in off["decisions"]


def test_a_value_two_kernels_read_is_written_out_past_the_recompute_budget_and_recomputed_within_it(found):
    over, within = found["budget"]
    assert "apart %3 mul: over the recompute budget" in over["decisions"]
    # written out, by the column kernel that reads it (fusion.take_producer), for the row kernel
    assert over["kernels"] == ["columns", "rows"]
    assert any(decision.endswith("an elementwise kernel's value joins the column kernel after it that reads it")
               for decision in over["decisions"])
    assert "fuse %3 mul: recomputing loads no more bytes than reading back" in within["decisions"]
    assert within["kernels"] == ["columns", "rows"]


def test_row_kernels_over_the_same_rows_and_a_store_reading_them_join_by_named_rules(found):
    found_all, found = found, found["row_merge"]
    assert found["unfused"] == ["rows", "rows", "elementwise"] and found["kernels"] == ["rows"]
    joins = [decision for decision in found["decisions"] if decision.startswith("fuse launch")]
    assert [join.split(": ")[1] for join in joins] == ["a row kernel joins the row kernel over the same rows before it",
                                                      "a store joins the open row kernel"]
    assert found_all["other_rows"]["kernels"] == ["rows", "rows"]  # rows of another length: a kernel each
    assert found_all["other_rows"]["decisions"][-1] == \
        "apart launch 1 rows -> b3: refused by: a row kernel joins the row kernel over the same rows before it"


def test_a_store_of_a_column_kernels_space_that_reads_its_operands_joins_it(found):
    joined = found["tile_store"]
    # the gradient's own kernel joins the column kernel too (fusion.take_producer), which then
    # computes it rather than read it back, and no kernel is left to read its store
    assert joined["unfused"] == ["elementwise", "columns", "elementwise"] and joined["kernels"] == ["columns"]
    rule = "a store joins the open column kernel of its space, reading its operands"
    assert any(decision.startswith("fuse launch 2 elementwise") and decision.endswith(rule)
               for decision in joined["decisions"])
    # a store that reads none of the column kernel's operands gains nothing there
    assert found["tile_store_unrelated"]["kernels"] == ["columns", "elementwise"]
    assert f"refused by: {rule}" in found["tile_store_unrelated"]["decisions"][-1]


def test_a_layout_a_lowering_rule_chooses_is_a_named_decision_too(found):
    # the cross-entropy's row kernel writes the softmax of the same logits beside the loss
    decisions = found["beside"]["decisions"]
    assert any(d.startswith("fuse %") and d.endswith("softmax: the loss kernel gives it beside the loss")
               for d in decisions), decisions
    assert found["beside"]["unfused"].count("cross-entropy") == 1
