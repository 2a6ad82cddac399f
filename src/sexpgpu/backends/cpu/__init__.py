"""The CPU interpreter: numpy, fixed-order folds, portable math. See interpreter.py."""

from sexpgpu.backends.cpu.interpreter import Interpreter

__all__ = ["Interpreter"]
