"""The registry of the machine's decisions (plan/choices.py), its cache (plan/cache.py) and
its lines (plan/levels.py), driven by a device whose facts, memory and timings the test sets.
Each test is one row of determinism.md's tables or one way of losing level 1."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph import compile_program
from sexpgpu.lang.forms import load_experiment
from sexpgpu.plan.cache import executable_identity, identity, open_cache
from sexpgpu.plan.choices import (
    DECISIONS,
    RECORD_KEYS,
    STRICT_RECOMPUTE,
    Forgetful,
    Situation,
    choices_from_json,
    decide,
    decide_strictly,
    take_pinned,
)
from sexpgpu.graph.training.stacking import stack_training
from sexpgpu.plan.cost import CostModel, graph_products
from sexpgpu.plan.device import DeviceProbe, Throughput
from sexpgpu.plan.levels import How, choices_line, determinism_line

from fake_device import A100, GIB, H200, FakeDevice

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def tiny_program(tmp_path: Path, microbatches: int = 4):
    text = (EXAMPLES / "tiny-adam.sexp").read_text()
    text = text.replace('"data/spirals.npz"', f'"{EXAMPLES}/data/spirals.npz"')
    text = text.replace(":steps 200", f":steps 4 :microbatches {microbatches}")
    path = tmp_path / "tiny.sexp"
    path.write_text(text)
    return compile_program(load_experiment(str(path), None), {"x": ((2,), "f32"), "y": ((), "i32")})


@pytest.fixture
def program(tmp_path):
    return tiny_program(tmp_path)


def situation(program, device, gradients="bf16", gpus=1, stackable=None, nodes=1) -> Situation:
    return Situation(device, program.training, program.stackable if stackable is None else stackable,
                     program.training.microbatches, gradients, gpus=gpus, nodes=nodes)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def cache_for(device, program):
    return open_cache(device.device_facts(), program.training)


def test_the_fake_device_is_a_device_probe():
    assert isinstance(FakeDevice(), DeviceProbe)


def test_every_decision_is_one_entry_with_every_facet():
    assert [decision.key for decision in DECISIONS] == ["stacking", "products", "recompute", "convolutions",
                                                         "node_gradients"]
    for decision in DECISIONS:
        assert decision.remembered in ("choices", "cost", "")
        assert callable(decision.make) and callable(decision.strict) and callable(decision.check_pin)
        assert decision.key in RECORD_KEYS


# --- stacking ---------------------------------------------------------------------------

def test_only_the_degrees_whose_plan_fits_are_offered_and_the_only_one_is_taken(program):
    device = FakeDevice(free_bytes=int(1.5 * GIB))
    ask = situation(program, device)
    assert ask.offered_degrees() == (1,)
    assert decide(ask, Forgetful()).stacking == 1
    assert device.measured == [("throughput",)]  # for the recompute budget; stacking measured nothing
    assert "stacking degrees 1 fit 1.5 GiB free (of 1, 2, 4)" in ask.notes


def test_the_cost_models_pick_is_taken_when_ahead_by_more_than_5_percent(program):
    device = FakeDevice()  # tiny graphs: launches dominate, so stacking 4 is far ahead
    model = CostModel(device.throughput)
    assert model.step_seconds(program.training, 4) * 1.05 < model.step_seconds(program.training, 2)
    ask = situation(program, device)
    assert decide(ask, Forgetful()).stacking == 4
    assert not [call for call in device.measured if call[0] == "step"]


def test_a_close_cost_model_measures_at_the_first_step(program):
    # arithmetic so slow that every degree costs the same: the model cannot tell them apart
    device = FakeDevice(throughput=Throughput(1.0, 1e30), step_seconds={1: 3.0, 2: 1.0, 4: 2.0})
    ask = situation(program, device)
    assert decide(ask, Forgetful()).stacking == 2
    assert [call for call in device.measured if call[0] == "step"] == [("step", 1), ("step", 2), ("step", 4)]
    assert any(note.startswith("stacking 2: measured at the first step") for note in ask.notes)


def test_a_program_kept_unstacked_is_offered_only_degree_1(program):
    ask = situation(program, FakeDevice(), stackable=False)
    assert ask.offered_degrees() == (1,)


def test_strict_stacking_is_1(program):
    assert decide_strictly(situation(program, FakeDevice())).stacking == 1


# --- products -------------------------------------------------------------------------

def test_the_graphs_float32_products_are_found_with_their_layouts(program):
    shapes = [shape for graph in program.training.graphs for shape in graph_products(graph)]
    assert shapes and all(shape.key().count("x") == 3 for shape in shapes)
    assert any(shape.a_transposed or shape.b_transposed for shape in shapes)  # the gradients' products


@pytest.mark.parametrize("split, expected", [(0.995, "ordinary"), (0.99, "split-k 2"), (0.98, "split-k 2")])
def test_ordinary_is_kept_unless_another_is_at_least_1_percent_faster(program, split, expected):
    device = FakeDevice(product_seconds={"ordinary": 1.0, "transposed": 1.5, "split-k 2": split})
    choices = decide(situation(program, device), Forgetful())
    assert choices.products and set(choices.products.values()) == {expected}
    assert set(choices.products) == product_keys(program, choices.stacking)


def test_products_are_decided_for_the_graph_at_the_chosen_stacking_degree(program):
    """A stacked run runs the stacked microbatch graph: its products are longer in M, and
    those are the keys the backend looks up."""
    device = FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5}, step_seconds={1: 1.0, 2: 0.1, 4: 0.9})
    choices = decide(situation(program, device), Forgetful())
    assert choices.stacking > 1
    assert set(choices.products) == product_keys(program, choices.stacking) != product_keys(program, 1)


def product_keys(program, degree: int) -> set:
    return {shape.key() for graph in stack_training(program.training, degree).graphs for shape in graph_products(graph)}


def test_several_gpus_take_ordinary_without_timing(program):
    device = FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5})
    products = decide(situation(program, device, gpus=2), Forgetful()).products
    assert set(products.values()) == {"ordinary"}
    assert not [call for call in device.measured if call[0] == "product"]


def test_strict_products_are_ordinary_with_no_measurement(program):
    device = FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5})
    choices = decide_strictly(situation(program, device))
    assert set(choices.products.values()) == {"ordinary"} and device.measured == []


# --- recompute, convolutions, gradients between nodes -----------------------------------

def test_the_recompute_budget_is_flops_over_bandwidth_and_strict_is_9(program):
    assert decide(situation(program, FakeDevice()), Forgetful()).recompute == 10.99
    assert decide_strictly(situation(program, FakeDevice())).recompute == STRICT_RECOMPUTE == 9.0


def test_a_model_without_convolutions_records_none(program):
    assert decide(situation(program, FakeDevice()), Forgetful()).to_json()["convolutions"] == {}


@pytest.mark.parametrize("setting", ["bf16", "f32"])
def test_gradients_between_nodes_are_the_setting_and_strict_is_f32(program, setting):
    assert decide(situation(program, FakeDevice(), setting, gpus=2, nodes=2), Forgetful()).node_gradients == setting
    assert decide_strictly(situation(program, FakeDevice(), setting, gpus=2, nodes=2)).node_gradients == "f32"


@pytest.mark.parametrize("setting", ["bf16", "f32"])
def test_one_node_sends_no_gradients_between_nodes_and_records_null(program, setting):
    """determinism.md's record: `"node_gradients": null` on one node, whatever the setting."""
    for gpus in (1, 4):
        assert decide(situation(program, FakeDevice(), setting, gpus=gpus), Forgetful()).to_json()["node_gradients"] is None
        assert decide_strictly(situation(program, FakeDevice(), setting, gpus=gpus)).node_gradients is None


@pytest.mark.parametrize("setting", ["bf16", "f32"])
@pytest.mark.parametrize("recorded_dtype", [None, "bf16", "f32"])  # a dtype: an older sexpgpu's record of one node
def test_one_node_takes_a_record_of_any_gradients_between_nodes(program, setting, recorded_dtype):
    record = recorded(program, FakeDevice(), node_gradients=recorded_dtype)
    assert take_pinned(situation(program, FakeDevice(), setting), record, "their run").node_gradients is None


def test_several_nodes_take_the_recorded_gradients_or_the_setting_where_none_is_recorded(program):
    record = recorded(program, FakeDevice(), node_gradients="f32")
    assert take_pinned(situation(program, FakeDevice(), "f32", gpus=2, nodes=2), record, "x").node_gradients == "f32"
    one_node = replace(record, node_gradients=None)
    assert take_pinned(situation(program, FakeDevice(), "bf16", gpus=2, nodes=2), one_node, "x").node_gradients == "bf16"
    with pytest.raises(SexpgpuError) as raised:
        take_pinned(situation(program, FakeDevice(), "bf16", gpus=2, nodes=2), record, "their run")
    assert raised.value.code == "E-CHOICE-001"
    assert "its node_gradients: gradients between nodes were f32, and SEXPGPU_NODE_GRADIENTS says bf16" in str(raised.value)


def test_the_record_has_the_specs_shape(program):
    record = decide(situation(program, FakeDevice()), Forgetful()).to_json()
    assert list(record) == ["device", "strict", "stacking", "recompute", "convolutions", "products", "node_gradients"]
    assert record["device"] == "compute_80 with 108 multiprocessors, cuBLAS 130101, cuDNN 91300, Triton 3.6.0, patterns on"
    assert choices_from_json(json.loads(json.dumps(record)), "x").to_json() == record


# --- the cache --------------------------------------------------------------------------

def test_a_miss_measures_and_remembers_and_a_hit_measures_nothing(program, home):
    first = FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5})
    cache = cache_for(first, program)
    made = decide(situation(program, first), cache)
    assert cache.made and not cache.taken
    assert (home / ".cache/sexpgpu/choices.json").is_file()
    cost_files = list((home / ".cache/sexpgpu/cost").iterdir())
    assert len(cost_files) == 1 and cost_files[0].name.startswith("NVIDIA_A100-SXM4-80GB-")
    assert cost_files[0].name.endswith("-13000.json")
    # a second run on this machine: the same choices, even where the device would now time otherwise
    second = FakeDevice(product_seconds={"ordinary": 0.5, "split-k 2": 1.0})
    cache = cache_for(second, program)
    assert decide(situation(program, second), cache) == made
    assert cache.taken and not cache.made
    assert second.measured == []


def test_the_cost_file_keeps_the_measured_throughput_and_the_budget(program, home):
    decide(situation(program, FakeDevice()), cache_for(FakeDevice(), program))
    (cost_file,) = (home / ".cache/sexpgpu/cost").iterdir()
    values = {entry["key"]: entry["value"] for entry in json.loads(cost_file.read_text())["entries"].values()}
    assert values == {"throughput": {"flops_per_second": 19.5e12, "bytes_per_second": 1.775e12},
                      "recompute/recompute": 10.99}


def test_the_executable_and_the_generators_are_part_of_the_identity(program, tmp_path):
    binary = tmp_path / "python"
    binary.write_bytes(b"v1")
    before = executable_identity(str(binary))
    binary.write_bytes(b"v2 longer")
    assert executable_identity(str(binary)) != before
    plain = identity(A100, program.training)
    assert identity(A100, program.training, [program.training.micro]) != plain
    assert identity(H200, program.training) != plain


def test_the_cache_is_keyed_by_the_device_and_the_graph(program, tmp_path, home):
    decide(situation(program, FakeDevice()), cache_for(FakeDevice(), program))
    other_gpu = FakeDevice(facts=H200)
    cache = cache_for(other_gpu, program)
    decide(situation(program, other_gpu), cache)
    assert cache.made and not cache.taken
    other_graph = tiny_program(tmp_path, microbatches=2)
    cache = cache_for(FakeDevice(), other_graph)
    decide(situation(other_graph, FakeDevice()), cache)
    assert "stacking/degrees 1, 2" in cache.made


def test_another_process_holding_memory_offers_other_degrees_and_measures_again(program, home):
    decide(situation(program, FakeDevice()), cache_for(FakeDevice(), program))
    crowded = FakeDevice(free_bytes=int(2.5 * GIB))
    cache = cache_for(crowded, program)
    ask = situation(program, crowded)
    assert decide(ask, cache).stacking == 2
    assert "stacking/degrees 1, 2" in cache.made
    assert "stacking degrees 1, 2 fit 2.5 GiB free (of 1, 2, 4)" in ask.notes


def test_a_deleted_cache_measures_again(program, home):
    device = FakeDevice()
    decide(situation(program, device), cache_for(device, program))
    (home / ".cache/sexpgpu/choices.json").unlink()
    cache = cache_for(device, program)
    decide(situation(program, device), cache)
    assert "stacking/degrees 1, 2, 4" in cache.made


@pytest.mark.parametrize("garbage", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"format": 99, "entries": {}}'])
def test_a_damaged_cache_is_ignored_with_a_note(program, home, garbage):
    path = home / ".cache/sexpgpu/choices.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(garbage)
    cache = cache_for(FakeDevice(), program)
    assert decide(situation(program, FakeDevice()), cache).stacking == 4
    assert any(str(path) in note and "ignored" in note for note in cache.notes)
    assert json.loads(path.read_text())["format"] == 1  # rewritten whole


def test_unset_home_measures_and_says_so(program, monkeypatch):
    monkeypatch.delenv("HOME", raising=False)
    cache = cache_for(FakeDevice(), program)
    assert decide(situation(program, FakeDevice()), cache).stacking == 4
    assert cache.root is None and any("HOME is unset" in note for note in cache.notes)


def test_an_unwritable_cache_says_so_and_the_choices_stand(program, home):
    (home / ".cache").mkdir(parents=True)
    (home / ".cache/sexpgpu").write_text("a file where the cache directory belongs")
    cache = cache_for(FakeDevice(), program)
    assert decide(situation(program, FakeDevice()), cache).stacking == 4
    assert any("cannot be written" in note for note in cache.notes)


def test_two_runs_measuring_at_once_both_take_the_choice_remembered_first(program, home):
    """The second run looked before the first remembered, measured otherwise, and takes the
    first one's choice when it comes to remember its own: both runs, and later ones, agree."""
    first_device = FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5})
    second_device = FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 2.0})
    first, second = cache_for(first_device, program), cache_for(second_device, program)
    second.lookup("choices", "primed")  # reads the cache while it is still empty
    chosen_first = decide(situation(program, first_device), first)
    chosen_second = decide(situation(program, second_device), second)
    assert set(chosen_first.products.values()) == {"split-k 2"}
    assert chosen_second.products == chosen_first.products
    again = decide(situation(program, second_device), cache_for(second_device, program))
    assert again.products == chosen_first.products


def test_a_key_remembered_by_another_run_meanwhile_is_the_one_taken(program, home):
    first, second = cache_for(FakeDevice(), program), cache_for(FakeDevice(), program)
    assert first.lookup("choices", "stacking/x") is None and second.lookup("choices", "stacking/x") is None
    assert first.remember("choices", "stacking/x", 2) == 2
    assert second.remember("choices", "stacking/x", 4) == 2
    assert any("remembered its choice first" in note for note in second.notes)
    assert second.remember("choices", "stacking/y", 4) == 4  # and the first run's entries are kept beside it
    later = cache_for(FakeDevice(), program)
    assert (later.lookup("choices", "stacking/x"), later.lookup("choices", "stacking/y")) == (2, 4)
    assert second.remember("choices", "stacking/x", 4, acceptable=lambda value: value != 2) == 4  # unusable here


# --- pins -----------------------------------------------------------------------------

def recorded(program, device, **changes):
    return replace(decide(situation(program, device), Forgetful()), **changes)


def test_a_pin_is_taken_as_recorded_and_nothing_is_measured(program):
    record = recorded(program, FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5}), recompute=9.21)
    device = FakeDevice(facts=H200, product_seconds={"ordinary": 0.1, "split-k 2": 0.5})
    taken = take_pinned(situation(program, device), record, "their run")
    assert (taken.stacking, taken.recompute, taken.products) == (record.stacking, 9.21, record.products)
    assert taken.device == H200.line()
    assert device.measured == []


SPLIT = {"ordinary": 1.0, "split-k 2": 0.5}


@pytest.mark.parametrize("case, device, change, reason", [
    ("stacking that does not fit", FakeDevice(free_bytes=2 * GIB, product_seconds=SPLIT), {"stacking": 4},
     "its stacking: stacking 4: its memory plan needs 4.0 GiB and 2.0 GiB is free"),
    ("stacking that does not divide", FakeDevice(product_seconds=SPLIT), {"stacking": 3}, "stacking 3 does not divide"),
    ("an implementation not offered", FakeDevice(product_seconds={"ordinary": 1.0}), {},
     "this device does not offer 'split-k 2'"),
    ("a product the record has none for", FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5}),
     {"products": {}}, "has no recorded implementation"),
])
def test_a_pin_this_machine_cannot_take_stops_with_E_CHOICE_001(program, case, device, change, reason):
    record = recorded(program, FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5}), **change)
    with pytest.raises(SexpgpuError) as raised:
        take_pinned(situation(program, device), record, "their run")
    assert raised.value.code == "E-CHOICE-001" and reason in str(raised.value)


def test_a_generator_that_keeps_the_run_unstacked_refuses_a_stacked_pin(program):
    record = recorded(program, FakeDevice())
    with pytest.raises(SexpgpuError, match="kept unstacked"):
        take_pinned(situation(program, FakeDevice(), stackable=False), record, "their run")


def test_a_record_without_products_takes_ordinary(program):
    record = replace(recorded(program, FakeDevice()), products=None)
    device = FakeDevice(product_seconds={"ordinary": 1.0, "split-k 2": 0.5})
    taken = take_pinned(situation(program, device), record, "an old checkpoint")
    assert taken.products and set(taken.products.values()) == {"ordinary"}


@pytest.mark.parametrize("record", [None, [], {"stacking": "four", "device": "x"}, {"device": "x"}])
def test_a_record_that_is_not_a_choices_object_is_E_CHOICE_003(record):
    with pytest.raises(SexpgpuError) as raised:
        choices_from_json(record, "notes.json")
    assert raised.value.code == "E-CHOICE-003"


# --- the lines ------------------------------------------------------------------------

def test_each_level_line(program):
    assert determinism_line(How("own"), A100.line()).startswith(
        "1: this machine repeats these bits with this binary and ~/.cache/sexpgpu; another is 3, or 2 pinned")
    assert determinism_line(How("strict"), A100.line()).startswith("2: --deterministic")
    assert determinism_line(How("pinned", "runs/a/step-10", A100.line()), A100.line()).startswith(
        "2: pinned to the choices of runs/a/step-10, whose device facts read as this machine's")
    other = determinism_line(How("pinned", "runs/a/step-10", H200.line()), A100.line())
    assert other.startswith("3: pinned") and H200.line() in other and A100.line() in other
    assert determinism_line(How("rechosen", "--choices fresh"), A100.line()).startswith(
        "3: this resume chose again (--choices fresh)")
    assert determinism_line(How("interpreter"), "cpu").startswith("1 on every machine: the CPU interpreter")


def test_the_choices_line_names_the_device_facts(program):
    line = choices_line(recorded(program, FakeDevice()))
    assert line.startswith("stacking 4, recompute 10.99 flops a byte, 0 convolution engines")
    assert line.endswith("on compute_80 with 108 multiprocessors, cuBLAS 130101, cuDNN 91300, Triton 3.6.0, patterns on")


def test_cache_files_are_replaced_whole(program, home):
    decide(situation(program, FakeDevice()), cache_for(FakeDevice(), program))
    assert not [name for name in os.listdir(home / ".cache/sexpgpu") if name.startswith(".tmp-")]


def test_a_remembered_value_this_machine_cannot_take_is_chosen_again(program, home):
    device = FakeDevice()
    decide(situation(program, device), cache_for(device, program))
    path = home / ".cache/sexpgpu/choices.json"
    content = json.loads(path.read_text())
    for entry in content["entries"].values():
        if entry["key"].startswith("stacking/"):
            entry["value"] = 3  # does not divide 4 microbatches
    path.write_text(json.dumps(content))
    cache = cache_for(device, program)
    assert decide(situation(program, device), cache).stacking == 4
    assert "stacking/degrees 1, 2, 4" in cache.made
