"""The package layout is the pipeline: each stage imports only the stages before it.

Checked from the source text (every `import sexpgpu...` and `from sexpgpu... import`,
including those inside functions), so a lazy import cannot hide a backwards edge."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sexpgpu"
IMPORT = re.compile(r"^\s*(?:from|import)\s+sexpgpu(?:\.(\w+)|\s+import\s+\(?\s*(\w+))", re.MULTILINE)

# What each stage may import besides itself. `errors` is the shared error type, `settings`
# the table of SEXPGPU_* environment settings, `files` the atomic write and the lock.
ALLOWED = {
    "numerics": set(),
    "exact": set(),
    "errors": set(),
    "files": set(),
    "settings": {"errors"},
    "lang": {"errors"},
    "graph": {"errors", "lang", "numerics"},
    "plan": {"errors", "files", "graph"},
    "data": {"errors", "numerics", "store"},
    "backends": {"errors", "files", "settings", "graph", "plan", "numerics", "exact"},
    "store": {"errors", "files", "settings"},
    "distributed": {"errors", "settings", "backends"},
    "run": {"errors", "files", "settings", "lang", "graph", "plan", "backends", "distributed", "data", "store",
            "numerics"},
    "tools": {"errors", "files", "settings", "lang", "graph", "plan", "backends", "run", "store"},
    "ladder": {"errors", "files", "settings", "lang", "plan", "backends", "run", "tools", "store"},
    "cli": {"errors", "files", "settings", "lang", "distributed", "run", "tools", "ladder", "store"},
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
