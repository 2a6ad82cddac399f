"""The convolution engines decision (plan/choices.py's "convolutions"), its keys and engine texts
(backends/cuda/convolutions.py) and its entries in the cache (plan/cache.py), driven by a device whose
offered engines and timings the test sets (determinism.md, "What a run chooses": a
convolution's cuDNN engine)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph import compile_program
from sexpgpu.graph.training.stacking import stack_training
from sexpgpu.lang.forms import load_experiment
from sexpgpu.plan.cache import engine_identity, open_cache
from sexpgpu.plan.choices import CONVOLUTION_CANDIDATES, Forgetful, Situation, decide, decide_strictly, take_pinned
from sexpgpu.backends.cuda.convolutions import ConvolutionKey, Engine, engine_of, graph_convolutions, parse_engine
from sexpgpu.plan.levels import choices_line

from fake_device import H200, FakeDevice

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENGINES = {f"engine {number} knobs 2={number % 3}": 1.0 + (number == 5) * -0.5 + (number == 9) * -0.9
           for number in range(10)}  # engine 5 is the fastest of the first eight; engine 9, faster, is ninth


def cnn_program(tmp_path: Path, optimizer: str = "(adam :lr 0.01)", microbatches: int = 1):
    text = (EXAMPLES / "cnn.sexp").read_text().replace(":steps 120", f":steps 4 :microbatches {microbatches}")
    text = text.replace("(adam :lr 0.01)", optimizer)
    path = tmp_path / f"cnn-{len(optimizer)}-{microbatches}.sexp"
    path.write_text(text)
    return compile_program(load_experiment(str(path), None))


@pytest.fixture
def program(tmp_path):
    return cnn_program(tmp_path)


def situation(program, device, passes=()) -> Situation:
    return Situation(device, program.training, program.stackable, program.training.microbatches, "bf16",
                     passes=passes)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def keys_of(program) -> list:
    keys = []
    for graph in program.training.graphs:
        keys += [key for key in graph_convolutions(graph) if key not in keys]
    return keys


def timed(device) -> list:
    return [call for call in device.measured if call[0] == "convolution"]


# --- keys and engine texts --------------------------------------------------------------

def test_a_key_reads_as_the_specs_example():
    key = ConvolutionKey("Weight", 512, 8, 8, 256, 3, 3, 512, (1, 1), (1, 1), "bf16")
    assert key.key() == ("Weight Spec { batch: 512, height: 8, width: 8, channels: 256, kh: 3, kw: 3, out: 512, "
                         "stride: 1, padding: 1 } bf16")
    assert key.result == (512, 512, 8, 8)
    assert ConvolutionKey("Forward", 2, 5, 7, 2, 2, 3, 3, (1, 2), (0, 1), "f32").key().endswith(
        "stride: (1, 2), padding: (0, 1) } f32")


def test_the_cnns_microbatch_has_each_role_keyed_by_the_forward_geometry(program):
    keys = [key.key() for key in keys_of(program)]
    geometry = "batch: 32, height: 12, width: 12, channels: 1, kh: 3, kw: 3, out: 8, stride: 1, padding: 1 } f32"
    second = "batch: 32, height: 6, width: 6, channels: 8, kh: 3, kw: 3, out: 16, stride: 1, padding: 1 } f32"
    assert f"Forward Spec {{ {geometry}" in keys and f"Weight Spec {{ {geometry}" in keys
    assert f"Data Spec {{ {geometry}" not in keys  # the images are data: no cotangent is asked of them
    assert {f"Forward Spec {{ {second}", f"Data Spec {{ {second}", f"Weight Spec {{ {second}"} <= set(keys)
    assert len(keys) == 5 == len(set(keys))


def test_an_engine_text_reads_back_and_anything_else_is_not_one():
    engine = engine_of(47, {14: 2, 0: 3, 5: 3, 2: 3})
    assert engine.text() == "engine 47 knobs 0=3 2=3 5=3 14=2"
    assert parse_engine(engine.text()) == engine
    assert Engine(3).text() == "engine 3 knobs" and parse_engine("engine 3 knobs") == Engine(3)
    for text in ("engine 47", "engine x knobs", "engine 47 knobs 2", 47, None, "engine 47 knobs 2=3 "):
        assert parse_engine(text) is None


# --- the decision -----------------------------------------------------------------------

def test_the_fastest_of_the_first_eight_is_taken_and_the_rest_are_never_timed(program):
    device = FakeDevice(convolution_seconds=ENGINES)
    choices = decide(situation(program, device), Forgetful())
    assert choices.convolutions == {key.key(): "engine 5 knobs 2=2" for key in keys_of(program)}
    times = timed(device)
    assert len(times) == CONVOLUTION_CANDIDATES * len(keys_of(program))
    assert not [call for call in times if call[2] in ("engine 8 knobs 2=2", "engine 9 knobs 2=0")]
    assert choices_line(choices).startswith("stacking 1, recompute 10.99 flops a byte, 5 convolution engines")


def test_a_tie_takes_the_engine_the_heuristics_offer_first(program):
    device = FakeDevice(convolution_seconds={"engine 4 knobs": 1.0, "engine 2 knobs": 1.0, "engine 0 knobs": 1.5})
    assert set(decide(situation(program, device), Forgetful()).convolutions.values()) == {"engine 4 knobs"}


def test_strict_takes_the_first_engine_offered_and_times_nothing(program):
    device = FakeDevice(convolution_seconds=ENGINES)
    choices = decide_strictly(situation(program, device))
    assert set(choices.convolutions.values()) == {"engine 0 knobs 2=0"} and len(choices.convolutions) == 5
    assert device.measured == []


def test_several_gpus_take_the_first_engine_without_timing(program):
    device = FakeDevice(convolution_seconds=ENGINES)
    ask = Situation(device, program.training, program.stackable, 1, "bf16", gpus=2)
    assert set(decide(ask, Forgetful()).convolutions.values()) == {"engine 0 knobs 2=0"}
    assert timed(device) == []


def test_a_convolution_offered_no_engine_has_none(program):
    """cuDNN may offer a convolution nothing that passes the filters: the backend runs it
    PyTorch's way, and the map leaves it out."""
    first = keys_of(program)[0]
    device = FakeDevice(convolution_seconds=ENGINES, engines_for={first.key(): ()})
    choices = decide(situation(program, device), Forgetful())
    assert first.key() not in choices.convolutions and len(choices.convolutions) == 4


def test_engines_are_decided_for_the_stacked_graph_and_the_passes(tmp_path):
    program = cnn_program(tmp_path, microbatches=2)
    device = FakeDevice(convolution_seconds=ENGINES, step_seconds={1: 1.0, 2: 0.1})
    evaluation = stack_training(program.training, 2).micro  # a graph at another batch, standing for a pass
    choices = decide(situation(program, device, passes=(evaluation,)), Forgetful())
    assert choices.stacking == 2
    stacked = {key.key() for graph in stack_training(program.training, 2).graphs for key in graph_convolutions(graph)}
    assert set(choices.convolutions) == stacked and all("batch: 64" in key for key in stacked)


def test_without_engines_the_map_is_empty_and_the_report_says_why(program):
    device = FakeDevice(unavailable="cuDNN's frontend (nvidia-cudnn-frontend, the extra `cudnn`) is not installed")
    ask = situation(program, device)
    assert decide(ask, Forgetful()).convolutions == {}
    assert any(note.startswith("convolutions: cuDNN's frontend (nvidia-cudnn-frontend, the extra `cudnn`) is not "
                               "installed, so they run PyTorch's cuDNN convolutions") for note in ask.notes)


# --- the cache --------------------------------------------------------------------------

def test_each_engine_is_remembered_by_the_device_and_the_convolution_alone(program, tmp_path, home):
    first = FakeDevice(convolution_seconds=ENGINES)
    cache = open_cache(first.device_facts(), program.training)
    made = decide(situation(program, first), cache).convolutions
    entries = json.loads((home / ".cache/sexpgpu/choices.json").read_text())["entries"].values()
    engines = [entry for entry in entries if entry["key"].startswith("convolutions/")]
    assert len(engines) == 5
    assert all(entry["identity"] == {"gpu": "NVIDIA A100-SXM4-80GB", "driver": "13000", "cuDNN": "91300"}
               for entry in engines)
    # another model with the same convolutions (another update graph, so another run identity) times none
    other = cnn_program(tmp_path, "(sgd :lr 0.01)")
    assert cache.identity != open_cache(first.device_facts(), other.training).identity
    second = FakeDevice(convolution_seconds={text: 2.0 - seconds for text, seconds in ENGINES.items()})
    cache = open_cache(second.device_facts(), other.training)
    assert decide(situation(other, second), cache).convolutions == made
    assert timed(second) == [] and cache.taken.count("convolutions/" + keys_of(program)[0].key()) == 1
    # another cuDNN is another measurement
    third = FakeDevice(facts=replace(first.facts, libraries={**first.facts.libraries, "cuDNN": "91900"}),
                       convolution_seconds=ENGINES)
    decide(situation(program, third), open_cache(third.device_facts(), program.training))
    assert len(timed(third)) == CONVOLUTION_CANDIDATES * 5


def test_a_remembered_engine_no_longer_offered_is_timed_again(program, home):
    decide(situation(program, FakeDevice(convolution_seconds=ENGINES)),
           open_cache(FakeDevice().device_facts(), program.training))
    fewer = {text: seconds for text, seconds in ENGINES.items() if not text.startswith("engine 5 ")}
    device = FakeDevice(convolution_seconds=fewer)
    choices = decide(situation(program, device), open_cache(device.device_facts(), program.training))
    assert set(choices.convolutions.values()) == {"engine 0 knobs 2=0"} and timed(device)  # 9 is still ninth


# --- pins -----------------------------------------------------------------------------

def test_a_pinned_engine_is_taken_and_nothing_is_timed(program):
    record = decide(situation(program, FakeDevice(convolution_seconds=ENGINES)), Forgetful())
    device = FakeDevice(facts=H200, convolution_seconds=ENGINES)
    taken = take_pinned(situation(program, device), record, "their run")
    assert taken.convolutions == record.convolutions and timed(device) == []


@pytest.mark.parametrize("device, change, reason", [
    (FakeDevice(convolution_seconds={text: 1.0 for text in list(ENGINES)[:5]}), {},
     "cuDNN does not offer 'engine 5 knobs 2=2' here"),
    (FakeDevice(convolution_seconds=ENGINES), {"drop": 1}, "has no recorded engine"),
    (FakeDevice(unavailable="cuDNN's frontend (nvidia-cudnn-frontend, the extra `cudnn`) is not installed"), {},
     "cuDNN does not offer 'engine 5 knobs 2=2' here (cuDNN's frontend (nvidia-cudnn-frontend"),
    (FakeDevice(convolution_seconds=ENGINES), {"garbage": 1}, "are not a map of convolutions to engines"),
])
def test_a_pinned_engine_this_device_does_not_offer_stops_with_E_CHOICE_001(program, device, change, reason):
    record = decide(situation(program, FakeDevice(convolution_seconds=ENGINES)), Forgetful())
    engines = dict(record.convolutions)
    if "drop" in change:
        engines.pop(keys_of(program)[-1].key())
    record = replace(record, convolutions=["engine 5"] if "garbage" in change else engines)
    with pytest.raises(SexpgpuError) as raised:
        take_pinned(situation(program, device), record, "their run")
    assert raised.value.code == "E-CHOICE-001" and "its convolutions: " in str(raised.value)
    assert reason in str(raised.value)
    if "drop" in change:
        assert keys_of(program)[-1].key() in str(raised.value)


def test_an_empty_record_runs_pytorchs_convolutions_as_its_run_did(program):
    """A record made without the frontend (or before engines were recorded) names no engine;
    a run pinned to it takes none, wherever engines are offered."""
    record = decide(situation(program, FakeDevice()), Forgetful())
    assert record.convolutions == {}
    device = FakeDevice(convolution_seconds=ENGINES)
    assert take_pinned(situation(program, device), record, "an old checkpoint").convolutions == {}
    assert timed(device) == []


def test_the_words_the_probe_supplies_keep_the_records_and_the_cache_written_before():
    """The plan names no library: the probe's facts do, and what it recorded and remembered
    before reads the same (the engines' identity, the recorded device)."""
    assert engine_identity(H200) == {"gpu": "NVIDIA H200", "driver": "13000", "cuDNN": "91900"}
    assert H200.line() == "compute_90 with 132 multiprocessors, cuBLAS 130100, cuDNN 91900, Triton 3.6.0, patterns on"
    assert replace(H200, patterns=("convolutions",)).line().endswith(", patterns convolutions")
