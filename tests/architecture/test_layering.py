"""The package layout is the pipeline: each stage imports only the stages before it, no
module imports itself back through others, and every import names its module in full.

Checked from the source text (every `import sexpgpu...` and `from sexpgpu... import`,
including those inside functions), so a lazy import cannot hide a backwards edge or a cycle."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sexpgpu"
IMPORT = re.compile(r"^\s*(?:from|import)\s+sexpgpu(?:\.(\w+)|\s+import\s+\(?\s*(\w+))", re.MULTILINE)

# What each stage may import besides itself. `errors` is the shared error type, `settings`
# the table of SEXPGPU_* environment settings, `files` the atomic write and the lock, `version`
# the package's version.
ALLOWED = {
    "numerics": set(),
    "exact": set(),
    "errors": set(),
    "files": set(),
    "version": set(),
    "settings": {"errors"},
    "lang": {"errors"},
    "graph": {"errors", "lang", "numerics"},
    "plan": {"errors", "files", "graph"},
    "data": {"errors", "numerics", "store"},
    "backends": {"errors", "files", "settings", "graph", "plan", "numerics", "exact"},
    "store": {"errors", "files", "settings"},
    "distributed": {"errors", "settings", "backends"},
    "run": {"errors", "files", "settings", "lang", "graph", "plan", "backends", "distributed", "data", "store",
            "numerics", "version"},
    "tools": {"errors", "files", "settings", "lang", "graph", "plan", "backends", "run", "store", "version"},
    "ladder": {"errors", "files", "settings", "lang", "plan", "backends", "run", "tools", "store"},
    "cli": {"errors", "files", "settings", "lang", "distributed", "run", "tools", "ladder", "store"},
    "api": {"errors", "settings", "lang", "run", "tools", "store"},  # the command line's level, as calls
}


def stage_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py") if len(relative.parts) > 1 else relative.stem


def imported_stages(path: Path) -> set[str]:
    return {match.group(1) or match.group(2) for match in IMPORT.finditer(path.read_text())}


def test_every_stage_imports_only_what_comes_before_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        stage = stage_of(path)
        if stage in ("__init__", "__main__"):
            continue
        for other in imported_stages(path) - {stage} - {"__version__"}:
            if other not in ALLOWED.get(stage, set()):
                wrong.append(f"{path.relative_to(PACKAGE)} imports sexpgpu.{other}")
    assert not wrong, "\n".join(wrong)


def test_stage_graph_has_no_cycles():
    seen, done = set(), set()

    def visit(stage, trail):
        assert stage not in trail, " -> ".join(trail + [stage])
        if stage in done:
            return
        for other in sorted(ALLOWED.get(stage, ())):
            visit(other, trail + [stage])
        done.add(stage)

    for stage in ALLOWED:
        visit(stage, [])


# Relative imports only where a package must load under another name: sexpgpu.exact is also
# Hugging Face `kernels`' det_train (hub/det-train links to it), where `sexpgpu.` is not there.
RELATIVE_ALLOWED = ("exact",)
# Cycles between modules that another part of issue #35 removes, each named with that part;
# the lead empties this after merging. A cycle not here fails, and so does one here that is gone.


@functools.cache
def imports(path: Path) -> list:
    """The import statements of `path`, anywhere in it."""
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set) -> set[str]:
    """The modules of ours `path` imports anywhere in it: `from package import module` names
    the module, `from module import name` the module."""
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    found = set()
    for node in imports(path):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return {_known(name, modules) for name in found if name.startswith("sexpgpu")} - {None, module_name(path)}


def _known(name: str, modules: set) -> str | None:
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in modules else None


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imported_modules(path, modules) for path in paths}


def cycles(graph: dict) -> list[list[str]]:
    """Each set of modules that import one another (Tarjan's strongly connected components),
    as one cycle through them."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(_cycle_through(graph, set(component)))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def _cycle_through(graph: dict, component: set) -> list[str]:
    """A path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for other in sorted(graph[module] & component):
            if other == start:
                return paths[module] + [start]
            if other not in paths:
                paths[other] = paths[module] + [other]
                queue.append(other)
    raise AssertionError(f"no cycle through {component}")


def test_no_module_imports_itself_back():
    found = cycles(import_graph())
    new = [" -> ".join(cycle) for cycle in found]
    assert not new, "import cycles:\n" + "\n".join(new)


def test_imports_name_their_module_in_full():
    relative = [f"{path.relative_to(PACKAGE)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
                if stage_of(path) not in RELATIVE_ALLOWED
                for node in imports(path) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, "relative imports:\n" + "\n".join(relative)


def test_the_cycle_finder_finds_a_cycle_and_names_its_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["e", "e2", "e"]]


# What a backend may take from the plan: the generic registry (the probe's records, the cache's
# state, the report's levels) and the memory planner; the decisions and their spaces are the plan's
PLAN_FOR_BACKENDS = {"sexpgpu.plan.device", "sexpgpu.plan.cache", "sexpgpu.plan.levels", "sexpgpu.plan.fit",
                     "sexpgpu.plan.memory"}


def test_backends_take_only_the_generic_registry_and_the_memory_planner_from_the_plan():
    graph = import_graph()
    wrong = [f"{module} imports {other}" for module, imported in sorted(graph.items())
             if module.startswith("sexpgpu.backends.")
             for other in sorted(imported) if other.startswith("sexpgpu.plan") and other not in PLAN_FOR_BACKENDS]
    assert not wrong, "\n".join(wrong)


def test_the_plan_s_decisions_know_no_backend_s_library():
    """Each backend's probe supplies its choice spaces and keys (plan/device.py): cuDNN's engines
    and pattern graphs are named in backends/cuda alone."""
    assert "cudnn" not in (PACKAGE / "plan" / "choices.py").read_text().lower()
