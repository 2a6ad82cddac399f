"""The graph stage walks deep structures without recursion, and its memory plan is not
quadratic (issue 10). Each test failed before its fix."""

from __future__ import annotations

import time

import pytest

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph import compile_program
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.plan.memory import plan_memory

from graph_helpers import experiment

RUN = """
(defrun r :seed 1 :data (generator g) :model (m x) :loss (mse y)
  :optimizer (sgd :lr 0.1) :batch 2 :steps 1)
(defgenerator g (record :x (normal (batch 4)) :y (normal (batch 4))))
"""


def test_a_chain_of_a_thousand_graph_calls_compiles():
    calls = 1000
    chain = "".join(f"(defgraph g{i} (x) (g{i + 1} x))\n" for i in range(calls))
    text = chain + f"(defgraph g{calls} (x) (relu x))\n(defgraph m (x) (linear (g0 x) :out 4 :as head))\n" + RUN
    program = compile_program(experiment(text))
    assert program.training.micro.op_counts()["relu"] == 1


def test_three_thousand_nested_ops_compile_in_order():
    depth = 3000
    body = "(neg " * depth + "x" + ")" * depth
    program = compile_program(experiment(f"(defgraph m (x) (linear {body} :out 4 :as head))\n" + RUN))
    assert program.training.micro.op_counts()["neg"] >= depth


def test_a_cycle_deep_in_a_chain_is_still_named():
    chain = "".join(f"(defgraph g{i} (x) (g{i + 1} x))\n" for i in range(500))
    text = chain + "(defgraph g500 (x) (g0 x))\n(defgraph m (x) (g0 x))\n" + RUN
    with pytest.raises(SexpgpuError) as caught:
        compile_program(experiment(text))
    assert caught.value.code == "E-GRAPH-005"
    assert "g0 -> g1 -> g2" in caught.value.message


def test_the_memory_plan_of_many_free_buffers_takes_linear_time():
    """10,000 values die at once, then 10,000 larger values find no buffer that fits: a scan
    of the free list per value was 10^8 steps."""
    count = 10_000
    e = Emitter()
    x = e.input("x", "f32", (1,))
    small = [e("neg", x) for _ in range(count)]
    joined = e("concat", *small, axis=0)
    large = [e("broadcast", x, shape=(2,)) for _ in range(count)]
    graph = e.graph({"x": x}, {"joined": joined, **{f"y{i}": node for i, node in enumerate(large)}})
    start = time.perf_counter()
    plan = plan_memory(graph)
    assert time.perf_counter() - start < 5
    assert plan.arena_bytes == plan.peak_bytes - plan.input_bytes  # the broadcasts reuse the negations' block
