"""`:precision bf16` on a GPU: each example run twice gives the same metrics.jsonl, and the
CPU interpreter and the GPU stay within the loss envelope. Skipped where no GPU is present.

Run on a GPU machine with:  PYTHONPATH=src python3 -m pytest tests/cuda/test_precision_gpu.py -m gpu
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from gpu_driver import ENVELOPE_STEP, ENVELOPE_TAIL, run_on_the_gpu, train  # noqa: E402
from sexpgpu.backends.cpu import Interpreter  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# the float32 envelope (gpu_driver.py) holds in bf16 too (docs/cuda.md, "Mixed precision")


def in_bf16(name: str, tmp_path: Path, steps: int) -> Path:
    text = (EXAMPLES / name).read_text().replace('"data/', f'"{EXAMPLES}/data/')
    text = text.replace(":steps 200", f":steps {steps} :precision bf16")
    path = tmp_path / name
    path.write_text(text)
    return path


def bf16_experiment(name: str):
    from sexpgpu.lang.forms import load_experiment

    experiment = load_experiment(str(EXAMPLES / name))
    run = replace(experiment.run, precision="bf16")
    return replace(experiment, runs={**experiment.runs, run.name: run})


@pytest.mark.parametrize("name, steps", [("tiny-adam.sexp", 200), ("char-lm.sexp", 40)])
def test_a_bf16_run_twice_gives_the_same_metrics(name, steps, tmp_path):
    file = in_bf16(name, tmp_path, steps)
    logs = [(run_on_the_gpu(file, tmp_path / f"run{attempt}") / "metrics.jsonl").read_text() for attempt in range(2)]
    assert logs[0] == logs[1]


@pytest.mark.parametrize("name, steps", [("tiny-adam.sexp", 200), ("char-lm.sexp", 40)])
def test_cpu_and_gpu_bf16_loss_curves_stay_in_the_envelope(name, steps):
    from sexpgpu.backends.cuda.backend import CudaBackend

    experiment = bf16_experiment(name)
    gpu, _ = train(experiment, CudaBackend(), steps)
    cpu, _ = train(experiment, Interpreter(), steps)
    relative = np.abs(gpu - cpu) / np.abs(cpu)
    assert relative.max() <= ENVELOPE_STEP, relative.max()
    tail = abs(gpu[-10:].mean() - cpu[-10:].mean()) / cpu[-10:].mean()
    assert tail <= ENVELOPE_TAIL, tail
    assert gpu[-10:].mean() < gpu[:5].mean()  # and it learns


def test_bf16_products_keep_float32_accumulation_on():
    from sexpgpu.backends.cuda.backend import CudaBackend

    CudaBackend()
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction is False
