"""Every runnable snippet and command of README.md and docs/*.md runs as documented.

Each fenced code block is one of:
- an experiment (```lisp, ```sexp, or a plain block that starts with `(` or `;`): checked
  with `sexpgpu check`, and when it holds a defrun, trained for 2 steps on the CPU in a
  temporary folder. A fragment (a defgraph or defgenerator alone) is checked and trained
  with the small run of COMPLETIONS appended;
- shell commands (a plain block with a `sexpgpu` command): each `sexpgpu ...` part runs
  in-process through `sexpgpu.cli.main.main`, in a copy of the repository's examples whose
  runs are cut to 2 steps;
- Python (```python): executed, with the free names of the snippet given by PRELUDES and
  any change it needs to run on a CPU in a second, listed with its reason in EDITS;
- anything else (output, diagrams, grammars, file formats): not a program.
SKIPPED lists, with reasons, the few snippets that cannot run here. An entry that no longer
matches a snippet fails the test, so the lists stay as short as the documents allow.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from docs_markdown import DOCUMENTS, ROOT, Block, code_blocks
from sexpgpu.cli.main import main

SHORT_STEPS = 2
COMMAND = re.compile(r"^(\$ )?(\S*/)?sexpgpu\s")  # sexpgpu, .venv/bin/sexpgpu, $ sexpgpu
SHELL = re.compile(r"^(\$ )?(\S*/)?(sexpgpu|python3?|pip|pytest|torchrun|PYTHONPATH=\S*)\s")


@dataclass(frozen=True)
class Snippet:
    """Which snippet a table entry is about: its document and the start of its first line."""

    document: str
    starts: str

    def matches(self, block: Block) -> bool:
        return block.document.name == self.document and block.text.lstrip().startswith(self.starts)


SKIPPED = {
    Snippet("README.md", "python3 -m venv .venv && .venv/bin/pip install -e '.[test]'"):
        "installs the package and runs the whole test suite: that is CI itself",
    Snippet("README.md", "pip install '.[plot]'"):
        "installs from the package index: tests/packaging/test_wheel.py pip-installs a wheel built from the tree "
        "into a fresh venv and runs it, and checks that these lines' extras exist and gpu holds the CUDA backend's imports",
    Snippet("architecture.md", "experiment = lang.forms.load_experiment"):
        "a sketch of the stages' interfaces with elided arguments (`...`), not a program",
    Snippet("cuda.md", "backend = CudaBackend()"):
        "needs a compiled graph and a GPU; tests/cuda run this contract under Triton's interpreter",
    Snippet("exact.md", "accumulate(x, w) -> planes"):
        "a signature with its return written as `-> planes`, not a program",
    Snippet("language.md", "(defrun NAME :KEY VALUE ...)"):
        "the template of a defrun, with placeholders",
    Snippet("ladder.md", "sexpgpu ladder --quick --device cpu"):
        "half a minute of CPU on the reference ladder: tests/run/test_ladder.py's "
        "test_the_quick_ladder_passes_on_the_cpu_within_two_minutes runs this command, and tests/packaging/test_wheel.py "
        "runs it from a pip-installed wheel outside the checkout",
    Snippet("ladder.md", "sexpgpu ladder --envelopes --device cpu"):
        "four minutes of CPU: tests/run/test_ladder.py regenerates one tier's envelope with it and compares it with "
        "the committed one (test_the_cpu_regenerates_the_committed_chaotic_envelope_bit_for_bit)",
    Snippet("ladder.md", "sexpgpu ladder --envelopes gpt --device cuda"):
        "needs a GPU; tests/run/test_ladder.py runs the same code on the CPU and with a device that makes choices",
    Snippet("ladder.md", "sexpgpu ladder --device cpu --run-dir runs/ladder-cpu"):
        "the whole CPU ladder, five minutes of CPU: its quick tiers are tests/run/test_ladder.py's, its other tiers' "
        "envelopes are checked current there, and its report is the one bench/results/ladder/cpu/report.md holds",
    Snippet("ladder.md", "sexpgpu ladder --envelopes --device cuda\nsexpgpu ladder --device cuda"):
        "needs a GPU (an H200); tests/run/test_ladder.py runs the same code on the CPU",
    Snippet("distributed.md", "torchrun --standalone --nproc-per-node 2"):
        "starts torchrun and two processes, each importing torch: tests/run/test_distributed.py's "
        "test_the_documented_torchrun_command_trains_with_process_0_writing runs this command as it is written, on "
        "the file cut to six steps",
    Snippet("distributed.md", "torchrun --nnodes NODES"):
        "the template of a launch on several machines, with placeholders: tests/run/test_distributed.py runs 2 nodes "
        "of 2 processes with the environment torchrun gives them",
    Snippet("performance.md", "PYTHONPATH=src python3 bench/bench_cuda.py --models gpt-124m"):
        "minutes on an H200 each; tests/bench/test_bench_smoke.py runs every one of these scripts with --smoke",
    Snippet("tools.md", "sexpgpu plot runs/a runs/b -o runs.png"):
        "needs matplotlib, the optional extra plot; tests/run/test_plot.py draws it where matplotlib is installed",
}

# Shell steps before a documented `sexpgpu` command that the test does not run, and why.
NOT_RUN = {
    "python3 -m venv .venv": "makes the environment that this test already runs in",
    ".venv/bin/pip install -e .": "installs the package that this test imports",
    "PYTHONPATH=src python tests/fuzz/fuzz_cli.py": "the fuzzer's hand runner: tests/fuzz/test_fuzz_cli.py runs "
                                                    "--show and a small --cases run with --failures-out",
}

# A fragment's completion: the smallest run that uses what the fragment defines.
COMPLETIONS = {
    Snippet("language.md", "(defgraph block (x)"): """
        (defgenerator snippet-sequences
          (let x (normal (batch 8 64) :salt (:step :trip)))
          (record :x x :y x))
        (defrun snippet :seed 1 :data (generator snippet-sequences) :model (block x) :loss (mse y)
          :optimizer (sgd :lr 0.01) :batch 2 :steps 2)""",
    Snippet("language.md", "(defgraph cnn (x)"): """
        (defgenerator snippet-images
          (record :x (normal (batch 1 12 12) :salt (:step :trip))
                  :y (cast (bernoulli (batch) :p 0.5 :salt (:step :trip)) i32)))
        (defrun snippet :seed 1 :data (generator snippet-images) :model (cnn x) :loss (cross-entropy y)
          :optimizer (sgd :lr 0.01) :batch 2 :steps 2)""",
    Snippet("language.md", "(defgenerator teacher"): """
        (defgraph snippet-student (x) (linear x :out 4 :as fc))
        (defrun snippet :seed 1 :data (generator teacher) :model (snippet-student x) :loss (mse y)
          :optimizer (sgd :lr 0.01) :batch 2 :steps 2)""",
}

# The free names of a Python snippet, set before it runs.
PRELUDES = {
    Snippet("exact.md", "import torch"): """
import torch
import torch.distributed as dist
generator = torch.Generator().manual_seed(5)
x, w = torch.randn(3, 4096, generator=generator), torch.randn(2, 4096, generator=generator)
x_shard, w_shard = x, w
dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)""",
    Snippet("exact.md", "from pathlib import Path"): """
import torch
x, w = torch.randn(3, 64), torch.randn(2, 64)""",
    Snippet("numerics.md", "from sexpgpu import numerics as nx"): """
import numpy as np
step = 3
x = np.linspace(-4, 4, 101, dtype=np.float32)""",
    Snippet("api.md", "import sexpgpu"): """
import os
os.chdir(folder)  # the examples cut to 2 steps, and a place for the runs it writes""",
    Snippet("numerics.md", "spec = nx.draw_spec"): """
import os
import torch
from sexpgpu import numerics as nx
os.environ["TRITON_INTERPRET"] = "1"
key = nx.stream_key(7, "block0/noise#0")
step = torch.tensor(3, dtype=torch.int32)
out = torch.empty(4, 5)""",
}

# Changes a Python snippet needs to run on a CPU in a second: (documented, run instead, why).
EDITS = {
    Snippet("exact.md", "import torch"): [
        ('DetLinear(4096, 4096, device="cuda")', 'DetLinear(4096, 8, device="cpu")',
         "the same exact layer on the CPU, 8 outputs wide"),
    ],
    Snippet("api.md", "import sexpgpu"): [
        ("a.checkpoints[200]", "a.checkpoints[2]", "the examples are cut to 2 steps"),
        ('"runs/a/step-200"', '"runs/a/step-2"', "the examples are cut to 2 steps"),
    ],
    Snippet("numerics.md", "from sexpgpu import numerics as nx"): [
        ('device="cuda")', 'device="cpu")', "the draw on a torch device this machine has"),
    ],
    Snippet("numerics.md", "spec = nx.draw_spec"): [
        ('device="cuda")', ')', "CPU tensors, which Triton's interpreter (the prelude's TRITON_INTERPRET) runs"),
    ],
}

# What runs after a Python snippet: resources it holds let go, an environment it set restored, and what it
# says of its result checked.
CLOSING = {
    Snippet("exact.md", "import torch"): "dist.destroy_process_group()",
    Snippet("numerics.md", "spec = nx.draw_spec"): """
os.environ.pop("TRITON_INTERPRET")
assert torch.equal(out, nx.normal(nx.fold_in(key, 3), (4, 5), std=0.5, device="cpu"))""",
}


def kind_of(block: Block) -> str:
    code = [line.strip() for line in block.text.splitlines() if line.strip() and not line.strip().startswith(";")]
    if block.language in ("lisp", "sexp") or (block.language == "" and code and code[0].startswith("(def")):
        return "experiment"
    if block.language == "python":
        return "python"
    if block.language in ("", "sh", "shell", "bash") and code and all(SHELL.match(line) for line in code):
        return "shell"
    return "text"


def sexpgpu_commands(text: str) -> list[list[str]]:
    """The argv of every `sexpgpu` command in shell lines, also inside `a && b` chains. Every
    other part must be a step of NOT_RUN."""
    commands = []
    for line in text.splitlines():
        for part in filter(None, (part.strip() for part in line.split("&&"))):
            if COMMAND.match(part):
                commands.append(shlex.split(part.removeprefix("$ "))[1:])
            else:
                assert any(part.startswith(step) for step in NOT_RUN), \
                    f"a shell step the test neither runs nor excuses: {part}"
    return commands


def entry_for(table: dict, block: Block):
    return next((value for snippet, value in table.items() if snippet.matches(block)), None)


BLOCKS = [block for document in DOCUMENTS for block in code_blocks(document)]
RUNNABLE = [block for block in BLOCKS if kind_of(block) != "text" and entry_for(SKIPPED, block) is None]


def shortened(text: str) -> str:
    return re.sub(r":steps\s+\d+", f":steps {SHORT_STEPS}", text)


def examples_copy(folder: Path) -> None:
    """The repository's examples, cut to short runs, at `folder`/examples; their data also at
    `folder`/data, where the documents' snippets name it."""
    shutil.copytree(ROOT / "examples", folder / "examples")
    shutil.copytree(ROOT / "examples" / "data", folder / "data")
    for experiment in (folder / "examples").glob("*.sexp"):
        # a checkpoint every step: a short run then has one before its last step, to replay from
        experiment.write_text(re.sub(r":checkpoint\s+\d+", ":checkpoint 1", shortened(experiment.read_text())))


def run_cli(capsys, argv: list[str]) -> str:
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, f"sexpgpu {' '.join(argv)} exited {status}:\n{captured.err}"
    return captured.out + captured.err


def run_experiment(block: Block, folder: Path, capsys) -> None:
    text = block.text + (entry_for(COMPLETIONS, block) or "")
    path = folder / "snippet.sexp"
    path.write_text(shortened(text))
    run_cli(capsys, ["check", str(path)])
    if "(defrun" in text:
        run_cli(capsys, ["run", str(path), "--device", "cpu", "--run-dir", str(folder / "run")])
        assert (folder / "run" / "metrics.jsonl").read_text().count('"step"') >= SHORT_STEPS


def run_shell(block: Block, folder: Path, capsys) -> None:
    for argv in sexpgpu_commands(block.text):
        run_cli(capsys, argv)


def run_python(block: Block, folder: Path) -> None:
    source = block.text
    for documented, instead, _why in entry_for(EDITS, block) or []:
        assert documented in source, f"{block}: the edit of {documented!r} no longer applies"
        source = source.replace(documented, instead)
    namespace = {"folder": str(folder)}
    exec(compile(entry_for(PRELUDES, block) or "", f"prelude of {block}", "exec"), namespace)
    try:
        exec(compile(source, str(block), "exec"), namespace)
    finally:
        exec(entry_for(CLOSING, block) or "", namespace)


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_the_snippet_runs_as_documented(block, tmp_path, monkeypatch, capsys):
    examples_copy(tmp_path)
    kind = kind_of(block)
    if kind == "python":
        monkeypatch.chdir(ROOT)  # the snippets name files as seen from the repository
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # a process group listens on loopback only
        run_python(block, tmp_path)
        return
    monkeypatch.chdir(tmp_path)
    {"experiment": run_experiment, "shell": run_shell}[kind](block, tmp_path, capsys)


def test_every_table_entry_names_a_snippet_of_its_kind():
    for table in (SKIPPED, COMPLETIONS, PRELUDES, EDITS, CLOSING):
        for snippet in table:
            found = [block for block in BLOCKS if snippet.matches(block)]
            assert len(found) == 1, f"{snippet} matches {len(found)} snippets"
            assert kind_of(found[0]) != "text", f"{snippet} is not a program"


def test_the_documents_hold_snippets_of_every_kind():
    kinds = {kind_of(block) for block in RUNNABLE}
    assert kinds == {"experiment", "shell", "python"}
    assert len(RUNNABLE) >= 10


def test_the_readme_commands_and_flags_run(tmp_path, monkeypatch, capsys):
    # README.md's table of commands: each command and flag, on the first example cut short.
    examples_copy(tmp_path)
    monkeypatch.chdir(tmp_path)
    example = Path("examples/tiny-adam.sexp")
    example.write_text(re.sub(r":checkpoint\s+\d+", ":checkpoint 1", example.read_text()))
    table = (ROOT / "README.md").read_text().split("## Commands", 1)[1].split("\n\n", 2)[1]
    for synopsis in ("sexpgpu run FILE [SELECTION]", "sexpgpu check FILE [SELECTION]", "sexpgpu checkpoint PATH [--json] [--verify]"):
        assert f"`{synopsis}`" in table
    for flag in ("--run-dir", "--device auto/cpu/cuda", "--resume PATH/latest", "--checkpoint-to", "--choices RECORD/fresh",
                 "--deterministic"):
        assert f"`{flag}`" in table
    run_cli(capsys, ["check", str(example), "tiny-adam"])
    run_cli(capsys, ["run", str(example), "tiny-adam", "--device", "cpu", "--run-dir", "runs/a"])
    assert "step        2" in run_cli(capsys, ["checkpoint", "runs/a/step-2"])
    assert json.loads(run_cli(capsys, ["checkpoint", "runs/a/step-2", "--json"]))["step"] == 2
    run_cli(capsys, ["run", str(example), "--device", "auto", "--run-dir", "runs/a", "--resume", "runs/a/step-1"])
    run_cli(capsys, ["run", str(example), "--device", "cpu", "--run-dir", "runs/a", "--resume", "latest"])
    run_cli(capsys, ["run", str(example), "--device", "cpu", "--run-dir", "runs/b", "--checkpoint-to", "elsewhere"])
    assert sorted(path.name for path in Path("elsewhere").glob("step-*")) == ["step-1", "step-2"]
    assert "OK" in run_cli(capsys, ["checkpoint", "runs/a/step-2", "--verify"])
    run_cli(capsys, ["run", str(example), "--device", "cpu", "--run-dir", "runs/c", "--choices", "runs/a/step-2"])
    run_cli(capsys, ["run", str(example), "--device", "cpu", "--run-dir", "runs/d", "--choices", "fresh"])
    run_cli(capsys, ["run", str(example), "--device", "cpu", "--run-dir", "runs/e", "--deterministic"])
    # the tools that read finished runs (docs/tools.md), with each flag the table names
    for synopsis in ("sexpgpu evaluate RUN_DIR/CHECKPOINT...", "sexpgpu diff RUN_A RUN_B [--json]",
                     "sexpgpu replay CHECKPOINT [--steps N]", "sexpgpu plot RUN... -o FILE.png"):
        assert f"`{synopsis}`" in table
    for flag in ("--pass", "--file", "--device", "--choices", "--deterministic", "--metrics FILE"):
        assert f"`{flag}`" in table
    evaluated = run_cli(capsys, ["evaluate", "runs/a", "--pass", "eval", "--file", str(example), "--device", "cpu",
                                 "--choices", "fresh"])
    assert "evaluated offline on cpu interpreter" in evaluated
    assert "determinism 1" in run_cli(capsys, ["evaluate", "runs/a/step-2", "--device", "cpu", "--deterministic"])
    assert "identical (exit 0)" in run_cli(capsys, ["diff", "runs/a", "runs/c"])  # c took a's choices: same bits
    assert json.loads(run_cli(capsys, ["diff", "runs/a/metrics.jsonl", "runs/c/metrics.jsonl", "--json"]))["identical"]
    assert "replayed steps 2..2" in run_cli(capsys, ["replay", "runs/a/step-1", "--steps", "1", "--device", "cpu",
                                                     "--metrics", "runs/a/metrics.jsonl"])
    with pytest.raises(SystemExit):  # -o is required
        main(["plot", "runs/a"])
    capsys.readouterr()
