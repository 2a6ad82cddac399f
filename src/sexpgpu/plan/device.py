"""What the plan may ask of a device before it decides: the seam between `plan/` and the backends.

The plan makes every decision that can move a run's bits (plan/choices.py); a backend only
executes what was decided. To decide, the plan needs facts and measurements that only the
device has, so each backend that offers choices implements `DeviceProbe`, and tests drive
the plan with a device whose facts, free memory and timings they set themselves.

A probe measures; it never chooses. It is given a candidate and returns a number. What the
choices range over is the device's own: the plan handles its keys (a product's shape, a
convolution's key) and candidates (an implementation, an engine) as opaque values with a
`key()` and a text, so the CUDA backend's cuDNN engines and pattern graphs stay in
backends/cuda (convolutions.py, patterns.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class DeviceFacts:
    """What the device decides (determinism.md, "What the device decides"): two machines whose
    facts are equal lower a graph alike, so a record pinned from one is level 2 on the other."""

    gpu: str  # the product name, e.g. "NVIDIA H200"
    compute: str  # e.g. "compute_90"
    multiprocessors: int
    driver: str  # the CUDA driver API version, e.g. "13000"
    libraries: dict = field(default_factory=dict)  # name -> version: cuBLAS, cuDNN, and the kernels' compiler
    patterns: tuple = ()  # the names of the device's pattern graphs on (cuDNN's: backends/cuda/patterns.py)
    gpus: int = 1
    nodes: int = 1
    pattern_names: tuple = ()  # every pattern graph the device has, in the order the recorded device names them
    engine_library: str = ""  # the library of `libraries` whose engines a convolutions map names (cuDNN)
    engines_otherwise: str = ""  # how convolutions run where that library offers no engine

    def line(self) -> str:
        """The recorded `device` string, in the spec's wording:
        'compute_90 with 132 multiprocessors, cuBLAS 130100, cuDNN 91900, Triton 3.6.0, patterns on'."""
        libraries = ", ".join(f"{name} {version}" for name, version in self.libraries.items())
        text = f"{self.compute} with {self.multiprocessors} multiprocessors"
        text += f", {libraries}" if libraries else ""
        text += f", patterns {patterns_text(self.patterns, self.pattern_names)}"
        if self.gpus > 1 or self.nodes > 1:
            text += f", {self.gpus} GPUs on {self.nodes} nodes"
        return text


def patterns_text(on, names) -> str:
    """The recorded device's word for the patterns on, of all `names`: `on` (all), `off`
    (none), or their names joined by `+`, in the order of `names`."""
    on = tuple(name for name in names if name in on)
    if on and on == tuple(names):
        return "on"
    return "+".join(on) if on else "off"


@dataclass(frozen=True)
class ProductShape:
    """A long float32 product as the plan sees it: C[m, n] = sum over k of A[m, k] B[k, n],
    with `batch` independent products, and the operands' layouts as stored."""

    m: int
    n: int
    k: int
    batch: int = 1
    a_transposed: bool = False
    b_transposed: bool = False

    def key(self) -> str:
        layout = ("T" if self.a_transposed else "N") + ("T" if self.b_transposed else "N")
        return f"{self.batch}x{self.m}x{self.n}x{self.k} {layout}"


@dataclass(frozen=True)
class Throughput:
    """The device's measured float32 arithmetic and memory bandwidth; the recompute budget is
    their ratio (flops per byte)."""

    flops_per_second: float
    bytes_per_second: float

    @property
    def flops_per_byte(self) -> float:
        return self.flops_per_second / self.bytes_per_second


@runtime_checkable
class DeviceProbe(Protocol):
    """What a device answers for the plan. Every method measures or reports; none decides."""

    def device_facts(self) -> DeviceFacts: ...

    def free_memory_bytes(self) -> int:
        """Device memory free for this run now (another process's allocations excluded)."""

    def training_peak_bytes(self, training, degree: int) -> int:
        """Bytes the run's graphs need on this device when `degree` microbatches are stacked."""

    def time_training_step(self, training, degree: int, inputs) -> float:
        """Seconds of one training step at this stacking degree (warm, after compilation)."""

    def product_shapes(self, graph) -> tuple:
        """The float32 products of `graph` as this device runs them, each once: the keys a
        products map may name for it (a device may fold a product's rows, say)."""

    def product_implementations(self, shape: ProductShape) -> tuple:
        """The implementations this device can run for a product, 'ordinary' first
        (e.g. 'ordinary', 'transposed', 'split-k 2', 'split-k 4')."""

    def time_product(self, shape: ProductShape, implementation: str) -> float:
        """Seconds of one product of this shape with this implementation."""

    def measure_throughput(self) -> Throughput: ...

    def convolution_keys(self, graph) -> tuple:
        """The convolutions of `graph` as this device runs them, each once, as keys whose
        `key()` a convolutions map names (the CUDA backend's: convolutions.py's ConvolutionKey)."""

    def convolution_engines(self, key) -> tuple:
        """The engines this device offers for a convolution, as texts, in the order its
        library ranks them. Empty where the device runs convolutions another way
        (`convolutions_unavailable` says why, when it is the whole device)."""

    def convolutions_unavailable(self) -> str | None:
        """Why this device offers no convolution engines at all (e.g. cuDNN's frontend is not
        installed), or None when it offers them."""

    def time_convolution(self, key, engine: str) -> float:
        """Seconds of one convolution of `key` with this engine."""

    def patterns_line(self, graphs) -> str:
        """The report's `patterns` line: the device's pattern graphs on (the CUDA backend's
        cuDNN graphs), and what the lowering of `graphs` does with each group they match."""
