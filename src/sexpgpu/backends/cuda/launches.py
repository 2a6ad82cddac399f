"""The launches a lowered graph runs, in order, over an environment of buffers.

Every launch names the buffers it reads and writes (by key), so the memory plan can place
them; at run time `env[key]` is the buffer's tensor (the arena slice, an input, or an
output). A load inside a generated kernel carries its own view of a buffer; a launch that
calls PyTorch gets a strided tensor through `strided(env, key, view)`.

The lowering and the fusion pass make kernels as plain data, their expressions reading
buffers by key (`FlatLaunch`, rowmerge's `RowLaunch`, `ColumnLaunch`); code generation (`finish`)
turns each into a `KernelLaunch` that launches generated Triton source. `TorchLaunch`s are made
as they run. `launch_text` is a launch's text form (the lowering's dumps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from sexpgpu.backends.cuda.codegen.columns import ColumnKernel, ColumnSpec, roots_of
from sexpgpu.backends.cuda.codegen.columns import with_roots as column_roots
from sexpgpu.backends.cuda.codegen.expr import Expr, expression_text, nodes_in_order, number_operands
from sexpgpu.backends.cuda.codegen.flat import FlatSpec, flat_kernel
from sexpgpu.backends.cuda.codegen.space import View

DEVICE = "device"  # env entry: the torch.device the graph runs on (for a launch that makes a tensor)
# i64: an exact graph's accumulators (exact.py), int64 digits kept beside the arena; a draw's
# args words (draws.py)
TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "i32": "int32", "bool": "bool", "i64": "int64"}
ITEM_BYTES = {"f32": 4, "bf16": 2, "i32": 4, "bool": 1, "i64": 8}


@dataclass
class Buffer:
    key: str
    dtype: str  # storage dtype: f32, bf16, i32, bool, i64
    shape: tuple[int, ...]
    # input, arena, output, accumulator (an exact graph's digits, held in the environment), or
    # constant (`values`, made once with the executable: a draw's key and parameters)
    kind: str
    # held from the start: inputs may be placed in it before the run (placement.py); held to
    # the end, so no output shares its memory and every output may be lent and come back as an
    # input, unless a kernel updates it in place: then its result takes its memory there
    live_from_start: bool = False
    values: tuple = ()  # a constant buffer's elements, in C order

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= int(size)
        return count * ITEM_BYTES[self.dtype]


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, TORCH_DTYPES[dtype])


def strided(env: dict, key: str, view: View):
    """The buffer `key` seen through `view` (which must be over its own axes)."""
    base = env[key]
    return base.as_strided(tuple(view.dims), tuple(view.strides), base.storage_offset() + view.offset)


class Operand(NamedTuple):
    """A node's value where a launch reads it: a buffer seen through a view over the node's axes."""

    key: str
    view: View

    def strided(self, env: dict):
        return strided(env, self.key, self.view)


def reads_of(operands, *more: str) -> tuple[str, ...]:
    """The buffers the operands, then the keys `more`, name: each once, in order."""
    return tuple(dict.fromkeys([operand.key for operand in operands] + list(more)))


def same_memory(a, b) -> bool:
    """Whether two tensors are views of the same elements (a copy between them does nothing)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def loads_of(roots) -> tuple[str, ...]:
    """The buffers the expressions read, each once: loads, then scalars."""
    nodes = nodes_in_order(roots)
    return tuple(dict.fromkeys([node.attr[0] for node in nodes if node.op == "load"] +
                               [node.attr for node in nodes if node.op == "scalar"]))


@dataclass
class FlatLaunch:
    """A fused elementwise kernel still open to more outputs of the same space."""

    shape: tuple[int, ...]
    outputs: list = field(default_factory=list)  # (key, view over shape, storage dtype, value)
    kind: str = "elementwise"

    @property
    def reads(self) -> tuple[str, ...]:
        return loads_of(self.roots())

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(key for key, _, _, _ in self.outputs)

    def roots(self) -> list[Expr]:
        return [value for _, _, _, value in self.outputs]

    def finish(self, buffers: dict) -> "KernelLaunch":
        values, keys = number_operands([value for _, _, _, value in self.outputs])
        inputs = tuple(buffers[key].dtype for key in keys)
        outputs = tuple((view, dtype, value) for (_, view, dtype, _), value in zip(self.outputs, values))
        kernel = flat_kernel(FlatSpec(self.shape, inputs, outputs))
        return KernelLaunch(kernel, tuple(keys) + self.writes, self.reads, self.writes, self.kind)


@dataclass
class ColumnLaunch:
    """A column kernel before code generation; its expressions read buffers by key."""

    spec: ColumnSpec
    writes: tuple[str, ...]
    kind: str = "columns"
    # (key, view, value) of the elementwise kernels before it that it recomputes rather than
    # reads: a store joining it later reads them so too (fusion.recompute_producer)
    recomputed: tuple = ()

    def roots(self) -> list[Expr]:
        return roots_of(self.spec)

    @property
    def reads(self) -> tuple[str, ...]:
        return loads_of(self.roots())

    def finish(self, buffers: dict) -> "KernelLaunch":
        return kernel_launch(ColumnKernel, self.spec, self.roots(), column_roots, self.writes, buffers, self.kind)


def launch_text(launch) -> str:
    """A launch as text: its kind, its buffers, and a kernel's expressions, each node once."""
    head = f"{launch.kind} {type(launch).__name__} reads={','.join(launch.reads)} writes={','.join(launch.writes)}"
    roots = launch.roots() if hasattr(launch, "roots") else ()
    return "\n".join([head] + [f"  {line}" for line in expression_text(roots)])


@dataclass
class KernelLaunch:
    kernel: object  # a GeneratedKernel, RowKernel or ColumnKernel
    operands: tuple[str, ...]  # buffer keys, in the kernel's argument order
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    kind: str

    def __call__(self, env: dict) -> None:
        self.kernel(*[env[key] for key in self.operands])


@dataclass
class TorchLaunch:
    """A launch done by a PyTorch call: products (cuBLAS), gathers, sorts, copies."""

    run: object  # run(env) -> None
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    kind: str
    # (operand, arena key, view): where an input or output operand may live so that this
    # launch's copy of it is an identity (placement.py)
    aliases: tuple = ()
    product: object = None  # a float32 product's ProductShape: the key of the plan's choice for it
    engine: str | None = None  # the cuDNN engine a convolution's launch runs (None: PyTorch's convolution)
    pattern: str | None = None  # the key of the cuDNN pattern graph the launch runs (pattern_launches.py)

    def __call__(self, env: dict) -> None:
        self.run(env)


def kernel_launch(kernel_class, spec, roots: list[Expr], with_roots, output_keys, buffers: dict, kind: str) -> KernelLaunch:
    """A generated row or column kernel: number the operands its expressions read, put the
    numbered expressions and the operands' dtypes back in the spec, and launch it with the
    input buffers then the output buffers."""
    numbered, keys = number_operands(roots)
    dtypes = tuple(buffers[key].dtype for key in keys)
    kernel = kernel_class(with_roots(spec, numbered, dtypes))
    return KernelLaunch(kernel, tuple(keys) + tuple(output_keys), tuple(keys), tuple(output_keys), kind)
