"""graph/ is four packages, each importing only those before it:

    core      the IR, the op table, the emitter and rule tables: no language syntax
    frontend  forms to IR: core and sexpgpu.lang
    passes    graph to graph: core
    training  the training graphs: core, frontend and passes

`sexpgpu.errors` is everyone's. Checked from the source text: every import, also inside
functions, so a lazy import cannot hide a backwards arrow; and no module of graph/ reaches
itself through the imports of graph/ (the frontend's builder and built-in ops were such a cycle)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
GRAPH = SRC / "sexpgpu" / "graph"

ALLOWED = {
    "core": {"sexpgpu.errors", "sexpgpu.graph.core"},
    "frontend": {"sexpgpu.errors", "sexpgpu.graph.core", "sexpgpu.graph.frontend", "sexpgpu.lang"},
    "passes": {"sexpgpu.errors", "sexpgpu.graph.core", "sexpgpu.graph.passes"},
    "training": {"sexpgpu.errors", "sexpgpu.graph.core", "sexpgpu.graph.frontend", "sexpgpu.graph.passes",
                 "sexpgpu.graph.training"},
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def imports(path: Path) -> list[str]:
    """Every module `path` imports (`from P import name` gives P.name where that is a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.relative_to(SRC)}: a relative import"
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = (SRC / full.replace(".", "/")).with_suffix(".py").exists() or (SRC / full.replace(".", "/")).is_dir()
                found.append(full if is_module else node.module)
    return [name for name in found if name.startswith("sexpgpu")]


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_each_graph_package_imports_only_the_packages_before_it():
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in sorted((GRAPH / package).rglob("*.py")):
            wrong += [f"{module_name(path)} imports {name}" for name in imports(path)
                      if not any(under(name, prefix) for prefix in allowed)]
    assert wrong == []


def test_graph_holds_exactly_these_packages():
    packages = {path.name for path in GRAPH.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert packages == set(ALLOWED)


def test_no_module_of_graph_imports_itself_through_others():
    edges = {module_name(path): {name for name in imports(path) if under(name, "sexpgpu.graph")}
             for path in GRAPH.rglob("*.py") if path.name != "__init__.py"}
    try:
        tuple(TopologicalSorter(edges).static_order())
    except CycleError as cycle:
        raise AssertionError(" -> ".join(cycle.args[1])) from None
