"""`:arithmetic exact` on a GPU machine: the CUDA backend gives the CPU interpreter's bytes.
Skipped where no GPU is present.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_exact_mode_gpu.py -m gpu -n 0 -v

- every op that sums, with its gradient, on the device against the interpreter (the op that
  breaks, if one does, is named);
- tiny-adam, a smaller char-lm and the CNN example, each run on the CPU and on the GPU through
  the command line, give byte-identical metrics.jsonl and final checkpoints
  (model.safetensors, optimizer.safetensors); on the GPU every step is one call (tiny-adam's
  and the CNN's microbatches stacked, plan/choices.py's exact_stacking), whose gradients round
  straight from their operands, on the CPU tiny-adam's and the CNN's are several, whose sums
  are added as digits;
- a GPU checkpoint resumed on the CPU, and a CPU one resumed on the GPU, repeat the
  uninterrupted run's remaining steps and final checkpoint;
- from the second step an exact run's graphs replay CUDA graphs, with the interpreter's bits;
- `--device auto` takes the GPU for an exact run, which states the exact level;
- the exact gradient sums compose on the device (the CPU's per-microbatch accumulators
  combined and rounded on the GPU are the CPU's gradients, also through NCCL at world size 1).

Each run is a few steps (a few minutes in all on an H200, most of them the CPU's runs and the
first compilation of the GPU's kernels); the whole runs are made once and shared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from op_cases import CASES, case_graph, case_id  # noqa: E402
from sexpgpu.backends.cuda.exact import EXACT  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# Each example cut to a few exact steps, with a checkpoint at the end and one midway.
RUNS = {
    "tiny-adam.sexp": {":batch 64": ":batch 16 :microbatches 4 :arithmetic exact", ":steps 200": ":steps 4",
                       ":checkpoint 100": ":checkpoint 2"},
    "char-lm.sexp": {":context 64 :width 64 :heads 4 :ff 256 :layers 2": ":context 16 :width 32 :heads 2 :ff 64 :layers 1",
                     ":width 64 :heads 4 :ff 256": ":width 32 :heads 2 :ff 64",
                     "(text pydoc :context 64)": "(text pydoc :context 16)",
                     ":batch 16": ":batch 8 :arithmetic exact", ":steps 200": ":steps 2 :checkpoint 1"},
    "cnn.sexp": {":batch 32": ":batch 8 :microbatches 2 :arithmetic exact", ":steps 120": ":steps 2 :checkpoint 1"},
}


def exact_file(name: str, tmp_path: Path) -> Path:
    text = (EXAMPLES / name).read_text().replace('"data/', f'"{EXAMPLES}/data/')
    for old, new in RUNS[name].items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def sexpgpu(*args) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=3600)


def run(path: Path, device: str, run_dir: Path, *more) -> Path:
    result = sexpgpu("run", str(path), "--device", device, "--run-dir", str(run_dir), *more)
    assert result.returncode == 0, result.stderr
    return run_dir


def final_tensors(run_dir: Path) -> dict:
    last = max((path for path in run_dir.glob("step-*")), key=lambda path: int(path.name.split("-")[1]))
    return {name: (last / name).read_bytes() for name in ("model.safetensors", "optimizer.safetensors")}


def metrics(run_dir: Path) -> list:
    return (run_dir / "metrics.jsonl").read_text().splitlines()


@pytest.fixture(scope="module")
def whole_runs(tmp_path_factory):
    """{example: (file, {device: run directory})}: each example run once on each device."""
    made = {}

    def runs_of(name: str):
        if name not in made:
            folder = tmp_path_factory.mktemp(name.removesuffix(".sexp"))
            path = exact_file(name, folder)
            made[name] = path, {device: run(path, device, folder / device) for device in ("cpu", "cuda")}
        return made[name]

    return runs_of


@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_exact_run_on_the_cpu_and_on_the_gpu_gives_the_same_bytes(whole_runs, name):
    _, runs = whole_runs(name)
    assert (runs["cpu"] / "metrics.jsonl").read_bytes() == (runs["cuda"] / "metrics.jsonl").read_bytes()
    assert final_tensors(runs["cpu"]) == final_tensors(runs["cuda"])
    assert "exact on every device" in (runs["cuda"] / "report.txt").read_text()


@pytest.mark.parametrize("written_on, resumed_on", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_on_the_other_device_with_the_same_bytes(whole_runs, tmp_path, written_on, resumed_on):
    path, runs = whole_runs("tiny-adam.sexp")
    resumed = run(path, resumed_on, tmp_path / resumed_on, "--resume", str(runs[written_on] / "step-2"))
    assert metrics(resumed) == [line for line in metrics(runs[written_on]) if '"step": 3' in line or '"step": 4' in line]
    assert final_tensors(resumed) == final_tensors(runs[written_on])


def test_an_exact_runs_graphs_are_captured_and_replay_the_interpreters_bits(tmp_path):
    """From the second step the microbatch and update graphs replay CUDA graphs (the id checks
    before each replay, the gradient region's pending sums after it), from the third the
    gradients' rounding too (captured_sums.py), with the CPU's bits at every step."""
    from sexpgpu.lang.forms import load_experiment
    from sexpgpu.run.loop import Trainer
    from sexpgpu.run.setup import build_run

    experiment = load_experiment(exact_file("char-lm.sexp", tmp_path))
    records, captured = {}, None
    for device in ("cpu", "cuda"):
        built = build_run(experiment, device)
        trainer = Trainer(experiment.run, built.program, built.backend, built.feeder)
        state = built.initial_state()
        records[device] = [trainer.step(state) for _ in range(4)]
        if device == "cuda":
            training = trainer.stacking.training
            captured = (built.backend.is_captured(training.micro), built.backend.is_captured(training.update),
                        built.backend.rounding.is_captured())
    assert captured == (True, True, True)  # the gradients' rounding replays from the third step
    assert records["cpu"] == records["cuda"]


def test_auto_takes_the_gpu_for_an_exact_run():
    from sexpgpu.backends.select import select_backend

    from sexpgpu.backends.select import run_facts

    backend, facts = select_backend("auto")
    facts = run_facts(facts, "exact")
    assert backend.name == "cuda" and facts["kind"] == "cuda"
    assert facts["determinism"].startswith("exact on every device: ")
    assert facts["choices"].startswith("none: every sum exact and rounded once")


@pytest.mark.parametrize("case", [case for case in CASES if case[0] in EXACT], ids=case_id)  # the exact lowerings
def test_an_op_and_its_gradient_have_the_interpreters_bits_on_the_gpu(case):
    from sexpgpu.backends.cpu import Interpreter
    from sexpgpu.backends.cuda.backend import CudaBackend
    from sexpgpu.backends.exact_sums import accumulated, rounded_once
    from sexpgpu.exact import Accumulator, det_finalize

    from sexpgpu.graph.passes.exact_region import exact_graph

    graph, values = case_graph(case)
    graph = exact_graph(graph)
    want = Interpreter().run(graph, values)
    backend = CudaBackend()
    got = backend.run(graph, values)
    for name, value in want.items():
        if isinstance(value, Accumulator):
            rounded = np.ascontiguousarray(rounded_once(got[name]).cpu().numpy())
            assert rounded.tobytes() == np.ascontiguousarray(det_finalize(value).numpy()).tobytes(), name
            assert torch.equal(accumulated(got[name]).digits.cpu(), value.digits), name
        else:
            found = np.ascontiguousarray(backend.to_host(got[name]).astype(value.dtype))
            assert found.tobytes() == np.ascontiguousarray(value).tobytes(), name


def test_the_exact_gradient_sums_compose_on_the_gpu(tmp_path):
    """The interpreter's per-microbatch accumulators, combined and rounded on the GPU (and
    summed through NCCL at world size 1), are the gradients the CPU rounds."""
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "tests" / "run"))
    import exact_gradients_worker as worker
    from sexpgpu.exact import Accumulator, det_all_reduce, det_combine, det_finalize

    built = worker.exact_run()
    parts = [worker.accumulated(built, [microbatch]) for microbatch in range(worker.MICROBATCHES)]
    wanted = worker.one_process()
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for name, value in wanted.items():
            on_gpu = det_combine([Accumulator(part[name].digits.cuda()) for part in parts])
            rounded = det_finalize(det_all_reduce(on_gpu)).cpu()
            assert torch.equal(rounded.view(torch.int32), value.view(torch.int32)), name
    finally:
        dist.destroy_process_group()


def test_exact_calls_times_a_compiled_step_call_by_call(capsys):
    """bench/exact_calls.py on the GPU: its step runs eagerly (no entry point is called inside a
    replay, and CUDA events cannot be timed inside a capture), every call timed by events."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import exact_calls

    exact_calls.main(["--model", "gpt-tiny", "--rows", "3"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("gpt-tiny, one exact step") and torch.cuda.get_device_name() in printed[0]
    assert len(printed) == 5 and all("strides" in line and float(line.split()[0]) > 0 for line in printed[2:])
