"""The CPU interpreter: numpy and numba-compiled loops, fixed-order folds, portable math. See interpreter.py."""

from sexpgpu.backends.cpu.interpreter import Interpreter

__all__ = ["Interpreter"]
