"""The Triton kernel's logic, run on the CPU by Triton's interpreter, against the CPU implementation."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent


def interpreted(script: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, TRITON_INTERPRET="1")
    environment["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [environment.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, str(HERE / script)], env=environment, capture_output=True,
                          text=True, timeout=600)


def test_triton_kernel_in_the_interpreter_gives_the_cpu_digits():
    done = interpreted("exact_interpreter_check.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("same:") == 7


def test_float64_stage_kernels_in_the_interpreter():
    done = interpreted("float64_kernels_check.py")
    assert done.returncode == 0, done.stdout + done.stderr
    counts = [done.stdout.count(line) for line in ("within the bound:", "settled as rounded.settle:", "same digits:")]
    assert counts == [4, 2, 4], done.stdout
