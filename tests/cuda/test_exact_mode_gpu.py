"""`:arithmetic exact` on a GPU machine. Skipped where no GPU is present.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_exact_mode_gpu.py -m gpu -n 0 -v

What holds today: the CUDA backend refuses an exact run with E-EXACT-003 rather than round
its sums, `--device auto` takes the interpreter and gives the `--device cpu` bytes, and the
exact gradient sums compose on the device (the CPU's per-microbatch accumulators combined
and rounded on the GPU are the CPU's gradients, also through NCCL at world size 1).

The cross-backend tests below (tiny-adam, char-lm and the CNN example on the CPU and on the
GPU give byte-identical metrics.jsonl and final checkpoints; a GPU run resumed on the CPU
matches) are written for the CUDA backend's exact lowering and skip while it refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# Each example cut to a few exact steps, with a checkpoint at the end and one midway.
RUNS = {
    "tiny-adam.sexp": {":batch 64": ":batch 16 :microbatches 4 :arithmetic exact", ":steps 200": ":steps 4",
                       ":checkpoint 100": ":checkpoint 2"},
    "char-lm.sexp": {":batch 16": ":batch 4 :microbatches 2 :arithmetic exact", ":steps 200": ":steps 2 :checkpoint 1"},
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


def cuda_runs_exact() -> bool:
    from sexpgpu.backends.select import select_backend
    from sexpgpu.errors import SexpgpuError

    try:
        select_backend("cuda", "exact")
    except SexpgpuError as refused:
        if refused.code == "E-EXACT-003":
            return False
        raise
    return True


def final_tensors(run_dir: Path) -> dict:
    last = max((path for path in run_dir.glob("step-*")), key=lambda path: int(path.name.split("-")[1]))
    return {name: (last / name).read_bytes() for name in ("model.safetensors", "optimizer.safetensors")}


def test_the_cuda_backend_refuses_an_exact_run_until_it_computes_one(tmp_path):
    if cuda_runs_exact():
        pytest.skip("the CUDA backend runs :arithmetic exact: the cross-backend tests below hold it to the CPU")
    result = sexpgpu("run", str(exact_file("tiny-adam.sexp", tmp_path)), "--device", "cuda",
                     "--run-dir", str(tmp_path / "gpu"))
    assert result.returncode == 2 and "E-EXACT-003" in result.stderr and "Traceback" not in result.stderr


def same_bytes_on(devices, path: Path, tmp_path: Path) -> None:
    """Runs of `path` on each device give byte-identical metrics.jsonl and final checkpoints."""
    for device in devices:
        result = sexpgpu("run", str(path), "--device", device, "--run-dir", str(tmp_path / device))
        assert result.returncode == 0, result.stderr
    first, other = (tmp_path / device for device in devices)
    assert (first / "metrics.jsonl").read_bytes() == (other / "metrics.jsonl").read_bytes()
    assert final_tensors(first) == final_tensors(other)


def test_auto_on_a_gpu_machine_gives_the_cpu_bytes(tmp_path):
    if cuda_runs_exact():
        pytest.skip("auto takes the GPU for exact runs now: see the cross-backend tests")
    same_bytes_on(("cpu", "auto"), exact_file("tiny-adam.sexp", tmp_path), tmp_path)


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


@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_exact_run_on_the_cpu_and_on_the_gpu_gives_the_same_bytes(name, tmp_path):
    if not cuda_runs_exact():
        pytest.skip("the CUDA backend refuses :arithmetic exact (E-EXACT-003)")
    same_bytes_on(("cpu", "cuda"), exact_file(name, tmp_path), tmp_path)


def test_a_gpu_checkpoint_resumes_on_the_cpu_with_the_same_bytes(tmp_path):
    if not cuda_runs_exact():
        pytest.skip("the CUDA backend refuses :arithmetic exact (E-EXACT-003)")
    path = exact_file("tiny-adam.sexp", tmp_path)
    whole = sexpgpu("run", str(path), "--device", "cuda", "--run-dir", str(tmp_path / "gpu"))
    assert whole.returncode == 0, whole.stderr
    resumed = sexpgpu("run", str(path), "--device", "cpu", "--run-dir", str(tmp_path / "cpu"),
                      "--resume", str(tmp_path / "gpu" / "step-2"))
    assert resumed.returncode == 0, resumed.stderr
    lines = (tmp_path / "gpu" / "metrics.jsonl").read_text().splitlines()
    again = (tmp_path / "cpu" / "metrics.jsonl").read_text().splitlines()
    assert again == [line for line in lines if '"step": 3' in line or '"step": 4' in line]
    assert final_tensors(tmp_path / "gpu") == final_tensors(tmp_path / "cpu")
