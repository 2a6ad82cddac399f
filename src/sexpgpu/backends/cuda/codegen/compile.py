"""Generated source to a launchable Triton kernel.

Triton reads a kernel's source from its file, so each generated kernel is written once to
`~/.cache/sexpgpu/kernels/k_<sha256>.py`. Whoever can write that file could run code in the
next CUDA run, so the cache is guarded: the folder must belong to this user and be writable by
no one else (`private_folder`); a cached file is kept only when its content's hash is the one
its name gives, and rewritten otherwise; and what runs is the source this process generated,
compiled in memory, never the file's bytecode cache. When the home cache cannot be used, a
fresh private folder from `tempfile.mkdtemp` holds this process's kernels: never a
predictable shared path, which another user could create first.

Every launch passes `enable_fp_fusion=False`: no multiply-add is contracted into an FMA, so a
generated kernel rounds where its expression says.

Generated kernels use Triton's core operations and this package's own device functions
only, never the @triton.jit functions of triton.language.standard (tl.sum, tl.zeros, ...):
those are compiled or interpreted as Triton was first imported, so a process that imports
Triton in compiled mode and then turns TRITON_INTERPRET on (the CI tests do) could not
call them from an interpreted kernel.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import stat
import tempfile
import types
from dataclasses import dataclass

from sexpgpu.files import write_atomically

HEADER = "import triton\nimport triton.language as tl\n"
TABLE_ARGUMENT = ", tab):"  # the signature of a kernel that reads the numerics table
DIGEST_CHARS = 24  # of the SHA-256 in hex: a kernel file's name
_loaded: dict[str, object] = {}
_fallback_folder: list[str] = []  # this process's private temporary folder, once made


def private_folder(folder: str) -> bool:
    """Whether `folder` is a real directory (not a link) that this user owns and that neither
    group nor others can write: only then may files in it be imported."""
    try:
        found = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() and not found.st_mode & 0o022


def kernel_folder() -> str:
    """~/.cache/sexpgpu/kernels when it and its sexpgpu folder are private (made so when this
    creates them), else a fresh private temporary folder for this process."""
    cache = os.path.join(os.path.expanduser("~"), ".cache", "sexpgpu")
    folder = os.path.join(cache, "kernels")
    try:
        for made in (cache, folder):  # makedirs gives its mode to the last folder only
            os.makedirs(made, mode=0o700, exist_ok=True)
    except OSError:
        pass
    if private_folder(cache) and private_folder(folder) and os.access(folder, os.W_OK):
        return folder
    if not _fallback_folder:
        _fallback_folder.append(tempfile.mkdtemp(prefix="sexpgpu-kernels-"))
        atexit.register(shutil.rmtree, _fallback_folder[0], ignore_errors=True)
    return _fallback_folder[0]


def content_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def _cached_file(folder: str, source: str) -> str:
    """The path of `source` in `folder`, written there unless a file whose content hashes to
    its name is already there."""
    data = source.encode()
    path = os.path.join(folder, f"k_{content_digest(data)}.py")
    try:
        with open(path, "rb") as handle:
            if content_digest(handle.read()) == content_digest(data):
                return path
    except OSError:
        pass  # missing or unreadable: write it
    write_atomically(path, data)
    return path


def load_kernel(source: str):
    """The `kernel` function of a generated module."""
    digest = content_digest(source.encode())
    if digest in _loaded:
        return _loaded[digest]
    path = _cached_file(kernel_folder(), source)
    # Run the source this process generated, compiled here, never bytecode from __pycache__;
    # the file (whose content was just checked) is what Triton reads the kernel's text from.
    module = types.ModuleType(f"sexpgpu_kernel_{digest}")
    module.__file__ = path
    exec(compile(source, path, "exec"), module.__dict__)
    _loaded[digest] = module.kernel
    return module.kernel


@dataclass
class GeneratedKernel:
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
