"""cuDNN convolution engines on a real GPU (docs/determinism.md, "What a run chooses"; docs/cuda.md,
"Convolution and pooling"): what cuDNN's frontend offers for each role, every offered engine
against the CPU interpreter, a run that chooses and records each role's engine, repeats its
bits from the cache and when pinned to its record, stops with E-CHOICE-001 on an engine cuDNN
does not offer, and under --deterministic takes the first plan the heuristics offer.
Skipped where no GPU is present; the engine tests are skipped, saying so, where the frontend
(the extra `cudnn`, `nvidia-cudnn-frontend`) is not installed.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_conv_engines_gpu.py -m gpu -s
(-s shows the engines cuDNN offers and the ones each run chose.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from op_cases import CASES, GPU_CASES, OpCase, case_graph, case_id  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402
from sexpgpu.backends.cuda.convolutions import ConvolutionKey, graph_convolutions, parse_engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHOICE_SETTINGS = ("SEXPGPU_CHOICES", "SEXPGPU_DETERMINISTIC", "SEXPGPU_NODE_GRADIENTS")
ENGINE = re.compile(r"^engine \d+ knobs( \d+=-?\d+)*$")
CPU = Interpreter()
CONVOLUTION_CASES = [case for case in CASES + GPU_CASES if case.op.startswith("conv2d")]
# larger cases, in both dtypes: the CNN example's second convolution, and a strided one
LARGER = [
    OpCase("conv2d", [(dtype, (32, 8, 6, 6), "normal"), (dtype, (16, 8, 3, 3), "normal")],
           {"stride": (1, 1), "padding": (1, 1)}) for dtype in ("f32", "bf16")
] + [
    OpCase("conv2d_input_grad", [(dtype, (32, 16, 6, 6), "normal"), (dtype, (16, 8, 3, 3), "normal")],
           {"stride": (1, 1), "padding": (1, 1), "input_shape": (32, 8, 6, 6)}) for dtype in ("f32", "bf16")
] + [
    OpCase("conv2d_weight_grad", [(dtype, (32, 8, 6, 6), "normal"), (dtype, (32, 16, 6, 6), "normal")],
           {"stride": (1, 1), "padding": (1, 1), "weight_shape": (16, 8, 3, 3)}) for dtype in ("f32", "bf16")
] + [
    OpCase("conv2d", [("f32", (8, 16, 15, 15), "normal"), ("f32", (32, 16, 3, 3), "normal")],
           {"stride": (2, 2), "padding": (1, 1)}),
]


UNIT = {"f32": 2.0 ** -24, "bf16": 2.0 ** -8}  # the unit roundoff of each output dtype


def assert_within_sum_bound(name: str, got: np.ndarray, graph, values: dict, output: str) -> None:
    """|got - interpreter| within what two float32 sums of n terms may differ by in any
    order, 2·n·2^-24·Σ|terms| a value, plus the output's rounding to its dtype. The terms'
    count n and their absolute sum come from the graph itself, run on ones and on |inputs|
    (a convolution's sum and its cotangents are multilinear, so both give the true figures).
    A fixed relative tolerance is wrong here: an output near zero of a long sum of large
    terms may differ by far more than its own magnitude allows."""
    want = CPU.run(graph, values)[output].astype(np.float64)
    ones = {key: np.ones_like(value) for key, value in values.items()}
    absolute = {key: np.abs(value) for key, value in values.items()}
    count = CPU.run(graph, ones)[output].astype(np.float64)
    magnitude = CPU.run(graph, absolute)[output].astype(np.float64)
    dtype = graph.outputs[output].dtype
    bound = 2.0 * count * 2.0 ** -24 * magnitude * 1.01 + 2.0 * UNIT[dtype] * np.abs(want)
    excess = np.abs(got.astype(np.float64) - want) - bound
    assert np.all(excess <= 0), f"{name}: {int(np.sum(excess > 0))} outputs outside the bound, worst by {excess.max():.3g}"


@pytest.fixture(scope="module")
def engines():
    """cudnn_engines, or a skip that says why the frontend cannot be used here."""
    from sexpgpu.backends.cuda import cudnn_engines

    if cudnn_engines.frontend() is None:
        pytest.skip(cudnn_engines.unavailable())
    print(f"\ncuDNN's frontend {cudnn_engines.frontend_version()}, cuDNN {torch.backends.cudnn.version()}")
    return cudnn_engines


def key_of(case) -> ConvolutionKey:
    graph, _ = case_graph(case, differentiate=False)
    (key,) = graph_convolutions(graph)
    return key


def backend_with(convolutions: dict):
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.cuda.fusion import policy_from_environment

    return CudaBackend(policy=replace(policy_from_environment(), convolutions=dict(convolutions)))


# --- what cuDNN offers -------------------------------------------------------------------------

def test_each_role_and_dtype_is_offered_deterministic_engines(engines):
    for case in CONVOLUTION_CASES + LARGER:
        key = key_of(case)
        offered = engines.offered(key, torch.cuda.current_device())
        plans = engines.plans_for(key, torch.cuda.current_device())
        print(f"{key.key()}: {len(offered)} offered of {plans.plan_count} plans"
              f"{' (' + plans.declined + ')' if plans.declined else ''}: {', '.join(offered)}")
        assert all(ENGINE.match(text) and parse_engine(text).text() == text for text in offered)
    for case in LARGER:
        assert engines.offered(key_of(case), torch.cuda.current_device()), key_of(case).key()


@pytest.mark.parametrize("case", CONVOLUTION_CASES + LARGER, ids=case_id)
def test_every_offered_engine_matches_the_interpreter_and_repeats_its_bits(engines, case):
    graph, values = case_graph(case, differentiate=False)
    key = key_of(case)
    offered = engines.offered(key, torch.cuda.current_device())
    if not offered:
        pytest.skip(f"cuDNN offers no engine for {key.key()} here: PyTorch's convolution runs it")
    for engine in offered[:8]:
        backend = backend_with({key.key(): engine})
        first = backend.to_host(backend.run(graph, values)["y"])
        again = backend.to_host(backend.run(graph, values)["y"])  # the second run is the captured graph
        assert_within_sum_bound(f"{key.key()} {engine}", first, graph, values, "y")
        assert first.tobytes() == again.tobytes(), engine


def test_the_lowering_runs_the_engine_it_was_given_and_pytorch_for_the_rest(engines):
    """The forward convolution, whose key the policy names, is a step of its engine's; its
    two cotangents, not named, are PyTorch's. Every output matches the interpreter."""
    case = LARGER[0]
    graph, values = case_graph(case, differentiate=True)
    key = key_of(case)
    offered = engines.offered(key, torch.cuda.current_device())
    assert offered
    backend = backend_with({key.key(): offered[0]})
    steps = [step for step in backend.lowered(graph).launches if step.kind == "convolution"]
    ran = [step.engine for step in steps]
    assert len(ran) == 3 and ran.count(offered[0]) == 1 and ran.count(None) == 2, ran
    got = backend.run(graph, values)
    for name in graph.outputs:
        assert_within_sum_bound(name, backend.to_host(got[name]), graph, values, name)


# --- runs --------------------------------------------------------------------------------------

@pytest.fixture
def cnn(tmp_path, request) -> Path:
    """The CNN example, 30 steps with a checkpoint and an eval pass every 10, in its precision."""
    precision = getattr(request, "param", "f32")
    text = (ROOT / "examples" / "cnn.sexp").read_text()
    text = text.replace(":steps 120", ":steps 30 :checkpoint 10" + (" :precision bf16" if precision == "bf16" else ""))
    text = text.replace("(eval :every 40 :batches 4)", "(eval :every 10 :batches 2)")
    path = tmp_path / f"cnn-{precision}.sexp"
    path.write_text(text)
    return path


def run(experiment, run_dir, home, *flags, code=0):
    environment = {key: value for key, value in os.environ.items() if key not in CHOICE_SETTINGS}
    # keep the caller's PYTHONPATH (where the frontend may be installed) behind this tree's src
    path = os.pathsep.join(part for part in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if part)
    # these runs are about the engines the plan chooses: no convolution goes to a pattern graph
    # (tests/cuda/test_patterns_gpu.py runs those)
    environment.update({"PYTHONPATH": path, "HOME": str(home), "SEXPGPU_PATTERNS": "off"})
    done = subprocess.run([sys.executable, "-m", "sexpgpu", "run", str(experiment), "--device", "cuda", "--run-dir",
                           str(run_dir), *map(str, flags)], cwd=ROOT, capture_output=True, text=True,
                          env=environment, timeout=900)
    assert done.returncode == code, (done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout + done.stderr


def report_line(report: str, label: str) -> str:
    return next(line.strip()[len(label):].strip() for line in report.splitlines() if line.strip().startswith(label))


def recorded(run_dir: Path) -> dict:
    return json.loads((run_dir / "experiment.json").read_text())["choices"]["convolutions"]


def bits(run_dir: Path) -> str:
    return (run_dir / "metrics.jsonl").read_text()


def program_keys(experiment: Path, stacking: int = 1) -> list:
    """The convolution keys of the run's graphs, as the plan finds them."""
    from sexpgpu.graph import compile_program
    from sexpgpu.graph.training.stacking import stack_training
    from sexpgpu.lang.forms import load_experiment

    program = compile_program(load_experiment(str(experiment)))
    keys = []
    for graph in (*stack_training(program.training, stacking).graphs, *program.passes.values()):
        keys += [key for key in graph_convolutions(graph) if key not in keys]
    return keys


@pytest.mark.parametrize("cnn", ["f32", "bf16"], indirect=True)
def test_a_run_chooses_each_roles_engine_records_it_and_repeats_its_bits_from_the_cache(engines, cnn, tmp_path):
    home = tmp_path / "home"
    first = run(cnn, tmp_path / "a", home)
    engines_chosen = recorded(tmp_path / "a")
    print(f"\n{cnn.name}: {json.dumps(engines_chosen, indent=1)}\n{report_line(first, 'choices')}")
    keys = program_keys(cnn)
    offered = {key.key(): engines.offered(key, torch.cuda.current_device()) for key in keys}
    assert set(engines_chosen) == {name for name, texts in offered.items() if texts}
    assert {key.split(" Spec ")[0] for key in engines_chosen} == {"Forward", "Data", "Weight"}
    for name, engine in engines_chosen.items():
        assert ENGINE.match(engine) and engine in offered[name][:8], (name, engine, offered[name])
    assert f"{len(engines_chosen)} convolution engines" in report_line(first, "choices")
    assert json.loads((tmp_path / "a/step-10/experiment.json").read_text())["choices"]["convolutions"] == engines_chosen
    cached = json.loads((home / ".cache/sexpgpu/choices.json").read_text())["entries"].values()
    assert {entry["key"] for entry in cached if entry["key"].startswith("convolutions/")} == \
        {f"convolutions/{name}" for name in engines_chosen}
    second = run(cnn, tmp_path / "b", home)
    assert "convolutions taken from" in second and recorded(tmp_path / "b") == engines_chosen
    assert bits(tmp_path / "a") == bits(tmp_path / "b")


def test_a_run_pinned_to_the_recorded_engines_repeats_their_bits(engines, cnn, tmp_path):
    run(cnn, tmp_path / "theirs", tmp_path / "home")
    shutil.rmtree(tmp_path / "home")
    report = run(cnn, tmp_path / "mine", tmp_path / "home", "--choices", tmp_path / "theirs/experiment.json")
    assert report_line(report, "determinism").startswith("2: pinned to the choices of")
    assert not (tmp_path / "home/.cache/sexpgpu/choices.json").exists()
    assert recorded(tmp_path / "mine") == recorded(tmp_path / "theirs")
    assert bits(tmp_path / "mine") == bits(tmp_path / "theirs")


def test_a_pinned_engine_cudnn_does_not_offer_stops_with_E_CHOICE_001(engines, cnn, tmp_path):
    run(cnn, tmp_path / "theirs", tmp_path / "home")
    experiment = json.loads((tmp_path / "theirs/experiment.json").read_text())
    name = sorted(experiment["choices"]["convolutions"])[0]
    experiment["choices"]["convolutions"][name] = "engine 9999 knobs 1=77"
    (tmp_path / "other.json").write_text(json.dumps(experiment))
    report = run(cnn, tmp_path / "mine", tmp_path / "home", "--choices", tmp_path / "other.json", code=2)
    assert "error E-CHOICE-001" in report and f"the convolution {name}: cuDNN does not offer 'engine 9999" in report
    assert not (tmp_path / "mine/metrics.jsonl").exists()


def test_deterministic_takes_the_first_plan_the_heuristics_offer_and_repeats(engines, cnn, tmp_path):
    run(cnn, tmp_path / "a", tmp_path / "home", "--deterministic")
    run(cnn, tmp_path / "b", tmp_path / "home", "--deterministic")
    for key in program_keys(cnn):
        offered = engines.offered(key, torch.cuda.current_device())
        assert recorded(tmp_path / "a").get(key.key()) == (offered[0] if offered else None), key.key()
    assert bits(tmp_path / "a") == bits(tmp_path / "b")


def test_the_engines_run_trains_like_pytorchs_convolutions(engines, cnn, tmp_path):
    """The CNN's loss falls with the chosen engines as with PyTorch's convolutions: the same
    distribution (the engines sum in other orders, so not the same bits)."""
    run(cnn, tmp_path / "engines", tmp_path / "home")
    losses = [record["loss"] for record in map(json.loads, bits(tmp_path / "engines").splitlines())
              if "loss" in record and "digest" in record]
    assert len(losses) == 30 and np.mean(losses[-5:]) < np.mean(losses[:5])
