"""Every backend meets one explicit contract (backends/contract.py's `Backend`), and the input
checks they share live in one place."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from sexpgpu.backends.contract import Backend, host_input
from sexpgpu.backends.cpu import Interpreter
from sexpgpu.graph.core.emit import Emitter

CONTRACT = [name for name, member in inspect.getmembers(Backend) if inspect.isfunction(member) and not name.startswith("_")]
ATTRIBUTES = {"name": str, "takes_choices": bool}
SOURCE = Path(__file__).resolve().parents[2] / "src" / "sexpgpu"
# getattr or hasattr on anything named backend (self.backend, built.backend, backend, ...),
# or a test of which backend it is
ASKED = re.compile(r"\b(?:getattr|hasattr)\(\s*[\w.]*backend\b[^)]*\)"
                   r"|backend(?:\.name|_facts(?:\.get\(|\[)[\"']kind[\"']\)?\]?)\s*[!=]=")


def _backend_classes():
    classes = [Interpreter]
    try:
        from sexpgpu.backends.cuda.backend import CudaBackend  # needs torch, not a GPU
    except ImportError:
        return classes
    return classes + [CudaBackend]


@pytest.mark.parametrize("backend_class", _backend_classes(), ids=lambda cls: cls.__name__)
def test_each_backend_offers_the_whole_contract_with_its_parameters(backend_class):
    assert set(ATTRIBUTES) == set(inspect.get_annotations(Backend))
    for name, kind in ATTRIBUTES.items():
        assert isinstance(inspect.getattr_static(backend_class, name), kind), name
    for name in CONTRACT:
        wanted = list(inspect.signature(getattr(Backend, name)).parameters)
        found = list(inspect.signature(getattr(backend_class, name)).parameters)
        if isinstance(inspect.getattr_static(backend_class, name), staticmethod):
            found = ["self"] + found
        assert found == wanted, f"{backend_class.__name__}.{name}{found} against the contract's {wanted}"


def test_the_interpreter_is_a_backend_at_run_time():
    assert isinstance(Interpreter(), Backend)


def test_nothing_asks_a_backend_what_it_offers():
    """The contract says what every backend offers: nobody looks for a member, or a default."""
    asked = [f"{path.relative_to(SOURCE)}: {found}" for path in sorted(SOURCE.rglob("*.py"))
             for found in ASKED.findall(path.read_text())]
    assert not asked, "\n".join(asked)


def test_no_backend_keeps_a_copy_of_the_shared_checks():
    for backend_class in _backend_classes():
        source = inspect.getsource(inspect.getmodule(backend_class))
        assert "def _check_names" not in source and "def _host_value" not in source


@pytest.mark.parametrize("value, dtype, problem", [
    (np.zeros(2, np.float64), "f32", TypeError), (np.array([2**31]), "i32", ValueError),
    (np.array([True]), "i32", TypeError), (np.zeros(2, np.int32), "bool", TypeError)])
def test_host_inputs_of_the_wrong_kind_are_refused_alike(value, dtype, problem):
    emit = Emitter()
    node = emit.input("x", dtype, value.shape)
    with pytest.raises(problem):
        host_input("x", node, value)
    with pytest.raises(problem):  # the interpreter refuses through the same check
        Interpreter().run(emit.graph({"x": node}, {"y": node}), {"x": value})
