"""Every rule table has a rule for every op it needs (graph/core/rules.py).

Each backend registers its rules against ops in RuleTables, one module per backend and
concern; a table's `needs` says which ops it must cover. This imports every module of
sexpgpu.backends that makes a table (found from the source text, so a new table is walked
without being listed here; the CUDA package imports without a GPU) and names each
(table, op) pair whose rule is missing."""

from __future__ import annotations

import importlib
from pathlib import Path

from sexpgpu.graph.core.ops import OPS, OpDef, define, undefine
from sexpgpu.graph.core.rules import TABLES, RuleTable

SRC = Path(__file__).resolve().parents[2] / "src"


def table_modules() -> list[str]:
    """The modules under sexpgpu/backends whose source makes a RuleTable."""
    paths = sorted((SRC / "sexpgpu" / "backends").rglob("*.py"))
    return [".".join(path.relative_to(SRC).with_suffix("").parts) for path in paths if "RuleTable(" in path.read_text()]


def missing_rules() -> list[str]:
    for name in table_modules():
        importlib.import_module(name)
    return [f"{table.concern}: no rule for {op}" for table in TABLES for op in table.missing()]


def test_the_cpu_interpreter_registers_its_kernels_in_tables():
    assert "sexpgpu.backends.cpu.op_kernels" in table_modules()


def test_every_table_has_a_rule_for_every_op_it_needs():
    assert missing_rules() == []


def test_an_op_without_its_rules_is_named_with_each_table_that_lacks_it():
    missing_rules()
    define(OpDef("frobnicate", "unary", lambda inputs, attrs: ("f32", (), attrs), arity=1))
    table = RuleTable("test rules", needs=lambda op: op.name in ("frobnicate", "neg"))
    table.add("neg", lambda node, args, m: -args[0])
    try:
        found = missing_rules()
        assert "test rules: no rule for frobnicate" in found and "cpu kernels: no rule for frobnicate" in found
        assert [line for line in found if line.startswith("test rules")] == ["test rules: no rule for frobnicate"]
    finally:
        undefine("frobnicate")
        TABLES.remove(table)
