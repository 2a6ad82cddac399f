"""Every script in bench/ runs in its smoke mode (bench/smoke.py: `--smoke`, the tiniest sizes,
one step) on the CPU, as a command, and prints its table or ratios: a benchmark broken by a
change elsewhere fails here, not on the day someone times something. The scripts are found
by glob, so a new one is run too; a module of bench/ that is not a script must be imported by
one, so that it runs with it. A script that writes its results through bench/harness.py writes
them, in a smoke run, to a temporary folder and not to bench/results/."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
FILES = sorted(BENCH.glob("*.py"))
SCRIPTS = [path for path in FILES if 'if __name__ == "__main__":' in path.read_text()]
NUMBER = r"-?\d+(?:\.\d+)?"
# what each script's smoke run prints where its table or its ratios are; another script's, a number
PRINTED = {
    "bench_attention.py": rf"fused fwd\+bwd ms \(dS in memory\)': {NUMBER}.*'sdpa fwd\+bwd ms': {NUMBER}",
    "bench_checkpoints.py": rf"ratio read / cp +{NUMBER}x[\s\S]*ratio write / upload_file +{NUMBER}x",
    "bench_choices.py": rf"deterministic/default +{NUMBER} \(goal at most 1.05\)",
    "bench_conv_engines.py": r"cnn.sexp in bf16\n  Forward Spec \{ batch: \d+",
    "bench_cuda.py": rf"char-lm-tiny f32: [\s\S]*ours vs ours-patterns-off: ours-patterns-off/ours {NUMBER}\n"
                     rf"  ours vs eager: eager/ours {NUMBER}[\s\S]*char-lm-tiny bf16: ",
    "bench_exact.py": rf"randn +{NUMBER} +{NUMBER}x[\s\S]*DetLinear is {NUMBER}x slower",
    "bench_exact_mode.py": rf"exact / float32: {NUMBER} \(goal <= 2.0\)",
    "bench_interpreter.py": rf"tiny-adam +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}[\s\S]*char-lm +{NUMBER}",
    "bench_numerics.py": rf"erf +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}[\s\S]*"
                         rf"normal +{NUMBER} +{NUMBER} +{NUMBER}   \(numpy Generator\)",
    "bench_tools.py": rf"replayed step +{NUMBER} ms +{NUMBER}x inline",
    "exact_calls.py": r"one exact step .* under Triton's interpreter:\n.*ms in exact calls\)\n .*strides",
    "exact_counts.py": r"all on the device +\d+ +\d+ +\d+  det_",
    "profile_cuda.py": rf"PyTorch eager \(f32\), one step, \w+ \w+: {NUMBER} ms in all\n +{NUMBER} ms",
    "profile_exact.py": rf"det_gemm, whole +{NUMBER} ms",
    "verify_numerics_speed.py": r"PASS erf [\s\S]*\nALL PASS",
}


def test_every_module_of_bench_that_is_not_a_script_runs_with_one():
    scripts = "".join(path.read_text() for path in SCRIPTS)
    for path in sorted(set(FILES) - set(SCRIPTS)):
        assert re.search(rf"^\s*(?:import|from) {path.stem}\b", scripts, re.MULTILINE), f"no script imports {path.name}"


def test_each_script_named_here_is_one():
    assert set(PRINTED) <= {path.name for path in SCRIPTS}


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_each_benchmark_runs_in_smoke_mode_on_the_cpu(script, tmp_path):
    # no GPU, whatever the machine: Triton's kernels run in its interpreter (bench/smoke.py)
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path),
                   "SEXPGPU_CPU_THREADS": "1", "TRITON_INTERPRET": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(script), "--smoke"], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    assert re.search(PRINTED.get(script.name, NUMBER), done.stdout), done.stdout[-4000:]
    # a phase timed inside another is that one's time: no share of a step comes out negative
    assert not re.search(r"\(-\d+%\)", done.stdout), done.stdout[-4000:]
    if re.search(r"^import harness$", script.read_text(), re.MULTILINE):  # it writes its results (bench/harness.py)
        written = re.findall(r"^results: (\S+\.json) and ", done.stdout, re.MULTILINE)
        assert written and all(Path(path).is_relative_to(tmp_path) and Path(path).exists() for path in written)
