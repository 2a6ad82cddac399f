"""The package as a user gets it. A wheel built from this tree, pip-installed into a fresh venv
with no extras (numpy from the index), runs the README's example and `sexpgpu ladder --quick
--device cpu` from a directory outside the checkout, without importing anything of the
checkout; an example that needs an extra says which, and exits 2. And the README's install
lines name extras that exist, the GPU one holding everything the CUDA backend imports."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "src" / "sexpgpu" / "ladder" / "reference"
# What setuptools reads to build the wheel; copied, so that the build leaves nothing in the checkout.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "src")
# The distribution that brings each module the CUDA backend imports besides the standard library's.
DISTRIBUTIONS = {"numpy": "numpy", "torch": "torch", "triton": "triton", "cudnn": "nvidia-cudnn-frontend"}


@dataclass(frozen=True)
class Install:
    """A fresh venv holding the wheel, and a directory outside the checkout to run it in."""

    venv: Path
    workdir: Path

    def run(self, program: str, *args) -> subprocess.CompletedProcess:
        # no PYTHONPATH (the tests' own may name the checkout's src/), and a home of its own, as on a new machine
        environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
        environment["HOME"] = str(self.workdir)
        return subprocess.run([str(self.venv / "bin" / program), *map(str, args)], cwd=self.workdir, env=environment,
                              capture_output=True, text=True, timeout=300)


def build_wheel(folder: Path) -> Path:
    tree = folder / "tree"
    tree.mkdir()
    for name in WHEEL_SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, tree / name)
    # as a user's pip builds it: in an isolated environment with pyproject.toml's build requirements
    pip(folder, "wheel", tree, "--no-deps", "-w", folder / "dist")
    (wheel,) = (folder / "dist").glob("sexpgpu-*.whl")
    return wheel


def pip(folder: Path, *args) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *map(str, args), "-q"], cwd=folder, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"pip {' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}{done.stderr}"


def installed(folder: Path, wheel: Path) -> Install:
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    pip(folder, "--python", venv / "bin" / "python", "install", wheel)  # this pip, installing into the new venv
    workdir = folder / "elsewhere"
    workdir.mkdir()
    return Install(venv, workdir)


def passed(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"{' '.join(done.args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_the_wheel_installed_in_a_fresh_venv_runs_an_example_and_the_quick_ladder_from_elsewhere(tmp_path):
    wheel = build_wheel(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    reference = {f"sexpgpu/{path.relative_to(ROOT / 'src' / 'sexpgpu').as_posix()}"
                 for path in REFERENCE.rglob("*") if path.is_file()}
    assert reference <= shipped, f"the wheel leaves out {sorted(reference - shipped)}"
    install = installed(tmp_path, wheel)

    where = passed(install.run("python", "-c", "import sexpgpu.ladder.tiers as t; print(t.__file__)"))
    assert Path(where.strip()).is_relative_to(install.venv), where  # the venv's copy, not the checkout's

    trained = passed(install.run("sexpgpu", "run", ROOT / "examples" / "tiny-adam.sexp", "--device", "cpu",
                                 "--run-dir", "tiny-adam"))
    assert "done: 200 steps" in trained

    ladder = passed(install.run("sexpgpu", "ladder", "--quick", "--device", "cpu"))
    assert re.search(r"ladder: \d+ pass", ladder) and " fail " not in ladder, ladder

    demo = install.run("python", ROOT / "examples" / "det_train_demo.py", "--steps", "1")
    assert demo.returncode == 2 and "Traceback" not in demo.stderr, demo.stderr
    assert "needs PyTorch" in demo.stderr and "pip install 'sexpgpu[torch]'" in demo.stderr


def test_the_reference_ladder_reads_the_same_spirals_as_the_examples():
    # a copy, so the wheel holds its tiers' data; examples/data/make_spirals.py draws the examples' one
    assert (REFERENCE / "data" / "spirals.npz").read_bytes() == (ROOT / "examples" / "data" / "spirals.npz").read_bytes()


def extras() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def requirements_of(extra: str) -> set:
    """The distributions an extra brings, through the extras of sexpgpu it names."""
    names = set()
    for requirement in extras()[extra]:
        name, _, rest = re.match(r"([A-Za-z0-9_.-]+)(\[([^\]]*)\])?", requirement).groups()
        names |= set().union(*map(requirements_of, rest.split(","))) if name == "sexpgpu" else {name.lower()}
    return names


def imported_modules(folder: Path) -> set:
    """The top-level modules that the Python files under `folder` import, outside the standard
    library and sexpgpu."""
    modules = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"sexpgpu"}


def test_the_readme_install_lines_name_extras_that_exist_and_gpu_has_what_the_cuda_backend_imports():
    readme = (ROOT / "README.md").read_text()
    named = {extra for line in re.findall(r"^pip install '\.\[([a-z0-9,]+)\]'", readme, re.M) for extra in line.split(",")}
    assert {"gpu", "plot"} <= named <= set(extras())
    imported = imported_modules(ROOT / "src" / "sexpgpu" / "backends" / "cuda")
    assert imported <= set(DISTRIBUTIONS), f"name the distribution of {sorted(imported - set(DISTRIBUTIONS))}"
    wanted = {DISTRIBUTIONS[module] for module in imported} - {"numpy"}  # numpy: a dependency of every install
    assert wanted <= requirements_of("gpu"), f"the extra gpu lacks {sorted(wanted - requirements_of('gpu'))}"
