"""Generated source to a launchable Triton kernel.

Triton reads a kernel's source from its file, so each generated kernel is written once to
`~/.cache/sexpgpu/kernels/k_<sha256>.py` (a temporary folder when that cannot be written)
and imported from there. The file's name is its content's hash, so a cached file is always
the source it names. Every launch passes `enable_fp_fusion=False`: no multiply-add is
contracted into an FMA, so a generated kernel rounds where its expression says.

Generated kernels use Triton's core operations and this package's own device functions
only, never the @triton.jit functions of triton.language.standard (tl.sum, tl.zeros, ...):
those are compiled or interpreted as Triton was first imported, so a process that imports
Triton in compiled mode and then turns TRITON_INTERPRET on (the CI tests do) could not
call them from an interpreted kernel.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass

HEADER = "import triton\nimport triton.language as tl\n"
TABLE_ARGUMENT = ", tab):"  # the signature of a kernel that reads the numerics table
_loaded: dict[str, object] = {}


def kernel_folder() -> str:
    home = os.path.expanduser("~")
    preferred = os.path.join(home, ".cache", "sexpgpu", "kernels")
    for folder in (preferred, os.path.join(tempfile.gettempdir(), f"sexpgpu-kernels-{os.getuid()}")):
        try:
            os.makedirs(folder, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            continue
    raise OSError("no writable folder for generated kernels")


def load_kernel(source: str):
    """The `kernel` function of a generated module."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    if digest in _loaded:
        return _loaded[digest]
    path = os.path.join(kernel_folder(), f"k_{digest}.py")
    if not os.path.exists(path):
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(source)
        os.replace(temporary, path)
    spec = importlib.util.spec_from_file_location(f"sexpgpu_kernel_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _loaded[digest] = module.kernel
    return module.kernel


@dataclass
class Launch:
    """One generated kernel with its fixed launch configuration. The grid and the warp count
    are functions of the shapes alone: they fix every reduction tree inside the kernel."""

    source: str
    grid: tuple[int, ...]
    num_warps: int
    name: str = "kernel"

    def __post_init__(self):
        self.function = load_kernel(self.source)
        self.uses_table = TABLE_ARGUMENT in self.source

    def __call__(self, *operands) -> None:
        if self.uses_table:
            from sexpgpu.backends.cuda.codegen.portable_math import table

            operands = operands + (table(operands[0].device),)
        self.function[self.grid](*operands, num_warps=self.num_warps, enable_fp_fusion=False)


def signature(pointers, uses_table: bool) -> str:
    names = list(pointers) + (["tab"] if uses_table else [])
    return f"def kernel({', '.join(names)}):"


def module_source(imports, body_lines) -> str:
    return HEADER + "".join(f"{line}\n" for line in sorted(imports)) + "\n\n" + "\n".join(body_lines) + "\n"
