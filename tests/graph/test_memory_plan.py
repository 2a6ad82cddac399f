"""The static memory plan: lifetimes, buffer reuse without overlap, peak bytes, and a value
taking over the block of one it updates in place."""

from __future__ import annotations

import numpy as np
import pytest

from sexpgpu.graph.core.emit import Emitter
from sexpgpu.plan.memory import Lifetime, lifetimes, liveness, plan_arena, plan_memory


def _chain(length: int, shape=(256,)):
    """x -> tanh -> tanh -> ... : each value dies when the next is made."""
    e = Emitter()
    x = e.input("x", "f32", shape)
    value = x
    for _ in range(length):
        value = e("tanh", value)
    return e.graph({"x": x}, {"y": value})


def test_a_chain_reuses_two_buffers_and_peaks_at_three_values():
    plan = plan_memory(_chain(10))
    size = 256 * 4
    assert plan.input_bytes == size
    assert plan.peak_bytes == 3 * size  # the input, the value read and the value made
    assert plan.arena_bytes == 2 * size
    assert [plan.offsets[i] for i in range(1, 11)] == [0, size] * 5


def _random_graph(seed: int):
    rng = np.random.default_rng(seed)
    e = Emitter()
    inputs = {f"x{i}": e.input(f"x{i}", "f32", (int(rng.integers(1, 5)) * 8,)) for i in range(3)}
    values = list(inputs.values())
    for _ in range(40):
        first = values[int(rng.integers(len(values)))]
        if rng.random() < 0.3:
            same = [v for v in values if v.shape == first.shape]
            values.append(e("add", first, same[int(rng.integers(len(same)))]))
        elif rng.random() < 0.5:
            values.append(e("concat", first, first, axis=0))
        else:
            values.append(e("exp", first))
    outputs = {f"y{i}": values[-1 - 3 * i] for i in range(3)}
    return e.graph(inputs, outputs)


def test_no_two_values_live_at_once_share_a_buffer_and_peak_is_the_most_live():
    for seed in range(20):
        graph = _random_graph(seed)
        plan = plan_memory(graph)
        spans = lifetimes(graph)
        for i, j in [(i, j) for i in plan.offsets for j in plan.offsets if i < j]:
            a, b = plan.offsets[i], plan.offsets[j]
            if a < b + graph.nodes[j].nbytes and b < a + graph.nodes[i].nbytes:  # overlapping memory
                assert spans[i][1] < spans[j][0], (seed, i, j)  # i dies before j is made
        live = [sum(graph.nodes[k].nbytes for k, (born, dies) in enumerate(spans) if born <= step <= dies)
                for step in range(len(graph.nodes))]
        assert plan.live_bytes == tuple(live) and plan.peak_bytes == max(live)
        assert plan.arena_bytes <= sum(node.nbytes for node in graph.nodes if node.op != "input")


def test_outputs_and_inputs_live_to_the_end():
    e = Emitter()
    x = e.input("x", "f32", (4,))
    early = e("exp", x)
    late = e("tanh", e("neg", x))
    graph = e.graph({"x": x}, {"early": early, "late": late})
    spans = lifetimes(graph)
    end = len(graph.nodes) - 1
    assert spans[0] == (0, end) and spans[1] == (1, end)


def test_bf16_values_count_two_bytes():
    e = Emitter()
    x = e.input("x", "f32", (10,))
    graph = e.graph({"x": x}, {"y": e("cast", x, dtype="bf16")})
    assert plan_memory(graph).peak_bytes == 40 + 20


def test_a_value_held_from_the_start_only_lives_to_its_last_use():
    steps = [((), ("a",)), (("held",), ("b",)), (("b",), ("c",))]
    lives = {life.key: life for life in liveness(steps, lambda key: 8, from_start={"held", "b"})}
    assert (lives["b"].born, lives["b"].dies) == (0, 2) and (lives["c"].born, lives["c"].dies) == (2, 2)


def _update_in_place(*after):
    """`old`, held from step 0, is read for the last time at step 2, which makes `new` over it."""
    return [Lifetime("old", 1000, 0, 2), Lifetime("other", 300, 1, 2), Lifetime("new", 1000, 2, 3), *after]


def test_a_value_made_in_place_takes_the_block_of_the_value_it_updates():
    plan = plan_arena(_update_in_place(), alignment=256, takes={"new": "old"})
    assert plan.offsets["new"] == plan.offsets["old"] and plan.takes == {"new": "old"}
    assert plan.arena_bytes == 1024 + 512  # without the takeover: another 1024
    assert plan_arena(_update_in_place(), alignment=256).arena_bytes == 2 * 1024 + 512
    assert "new takes old" in plan.dump()


def test_a_block_taken_over_goes_back_once():
    # the old value's death gives nothing back; the new one's gives the block back once, so two
    # values made together after it cannot both be given it
    after = [Lifetime("later", 1000, 4, 5), Lifetime("last", 1000, 4, 5)]
    plan = plan_arena(_update_in_place(*after), alignment=256, takes={"new": "old"})
    later, last = plan.offsets["later"], plan.offsets["last"]
    assert abs(later - last) >= 1024 and plan.offsets["old"] in (later, last)


@pytest.mark.parametrize("takes", [{"other": "old"}, {"later": "new"}, {"new": "other"}, {"new": "old", "later": "old"}],
                         ids=["born-before-it-dies", "born-after-it-dies", "another-size", "taken-twice"])
def test_a_takeover_of_a_value_that_does_not_die_where_the_new_is_born_is_refused(takes):
    with pytest.raises(ValueError):
        plan_arena(_update_in_place(Lifetime("later", 1000, 4, 5)), alignment=256, takes=takes)
