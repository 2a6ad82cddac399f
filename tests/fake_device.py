"""A device for tests: a `DeviceProbe` (plan/device.py) whose facts, free memory and timings
the test sets. It stands in for the GPU, not for the code under test: the plan, the cache and
the run loop are the real ones. `measured` lists every measurement asked of it, so a test can
see that a pinned or --deterministic run measured nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from sexpgpu.backends.cuda.convolutions import graph_convolutions
from sexpgpu.plan.cost import graph_products
from sexpgpu.plan.device import DeviceFacts, ProductShape, Throughput
from sexpgpu.backends.cuda.patterns import PATTERN_NAMES, PatternsInEffect, patterns_line
from sexpgpu.backends.cuda.probe import ENGINES_OTHERWISE

GIB = 2**30

# the CUDA probe's words for cuDNN's engines and pattern graphs (backends/cuda/probe.py)
CUDA_WORDS = {"pattern_names": PATTERN_NAMES, "engine_library": "cuDNN", "engines_otherwise": ENGINES_OTHERWISE}
A100 = DeviceFacts(gpu="NVIDIA A100-SXM4-80GB", compute="compute_80", multiprocessors=108, driver="13000",
                   libraries={"cuBLAS": "130101", "cuDNN": "91300", "Triton": "3.6.0"}, patterns=PATTERN_NAMES,
                   **CUDA_WORDS)
H200 = DeviceFacts(gpu="NVIDIA H200", compute="compute_90", multiprocessors=132, driver="13000",
                   libraries={"cuBLAS": "130100", "cuDNN": "91900", "Triton": "3.6.0"}, patterns=PATTERN_NAMES,
                   **CUDA_WORDS)


@dataclass
class FakeDevice:
    facts: DeviceFacts = A100
    free_bytes: int = 80 * GIB
    peak_bytes_per_degree: int = GIB  # the memory plan at degree k needs k times this
    step_seconds: dict = field(default_factory=dict)  # degree -> seconds of a step (default 1 / degree)
    product_seconds: dict = field(default_factory=dict)  # implementation -> seconds, offered for every product
    throughput: Throughput = Throughput(19.5e12, 1.775e12)  # 10.99 flops a byte
    convolution_seconds: dict = field(default_factory=dict)  # engine text -> seconds, offered for every convolution
    engines_for: dict = field(default_factory=dict)  # ConvolutionKey.key() -> the engines offered, in order
    unavailable: str | None = None  # convolutions_unavailable()'s answer
    patterns: PatternsInEffect = PatternsInEffect(PATTERN_NAMES)  # the patterns on, for patterns_line()
    uses: dict = field(default_factory=dict)  # id(graph) -> the PatternUses of its lowering
    measured: list = field(default_factory=list)

    def device_facts(self) -> DeviceFacts:
        return self.facts

    def free_memory_bytes(self) -> int:
        return self.free_bytes

    def training_peak_bytes(self, training, degree: int) -> int:
        return degree * self.peak_bytes_per_degree

    def time_training_step(self, training, degree: int, inputs) -> float:
        self.measured.append(("step", degree))
        return self.step_seconds.get(degree, 1.0 / degree)

    def product_shapes(self, graph) -> tuple:
        return graph_products(graph)

    def product_implementations(self, shape: ProductShape) -> tuple:
        return tuple(self.product_seconds) or ("ordinary",)

    def time_product(self, shape: ProductShape, implementation: str) -> float:
        self.measured.append(("product", shape.key(), implementation))
        return self.product_seconds[implementation]

    def measure_throughput(self) -> Throughput:
        self.measured.append(("throughput",))
        return self.throughput

    def convolution_keys(self, graph) -> tuple:
        return graph_convolutions(graph)

    def convolution_engines(self, key) -> tuple:
        if self.unavailable:
            return ()
        return tuple(self.engines_for.get(key.key(), tuple(self.convolution_seconds)))

    def convolutions_unavailable(self) -> str | None:
        return self.unavailable

    def time_convolution(self, key, engine: str) -> float:
        self.measured.append(("convolution", key.key(), engine))
        return self.convolution_seconds[engine]

    def patterns_line(self, graphs) -> str:
        return patterns_line(self.patterns, [use for graph in graphs for use in self.uses.get(id(graph), ())])
