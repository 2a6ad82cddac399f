"""What the CUDA backend tells the plan before it decides (plan/device.py's DeviceProbe).

    probe = CudaProbe(backend)
    probe.device_facts()                     # DeviceFacts: GPU, compute capability, driver, libraries
    probe.free_memory_bytes()                # free device memory now
    probe.training_peak_bytes(training, 4)   # bytes the run holds at stacking degree 4
    probe.time_training_step(training, 4, microbatch_inputs)
    probe.product_implementations(shape); probe.time_product(shape, "split-k 2")
    probe.measure_throughput()               # f32 FMA flops and copy bandwidth: the recompute budget
    probe.convolution_engines(key); probe.time_convolution(key, "engine 47 knobs 2=3")
    probe.patterns_line(graphs)              # cuDNN's native pattern graphs: the report's line

A probe measures; it never chooses, and it changes nothing the backend runs: timings use
backends of their own with the candidate's policy. Timings are CUDA events around warm
calls (the first call compiles and warms cuBLAS), the median of a few.

The CPU interpreter has no probe: it decides nothing (no stacking, no product
implementations, no recompute budget), so the plan never asks it; its runs keep their
machine-independent bits without one.
"""

from __future__ import annotations

import ctypes
import statistics
from dataclasses import replace

import numpy as np

from sexpgpu.backends.cuda import cudnn_engines
from sexpgpu.backends.cuda.device import cublas_version
from sexpgpu.backends.cuda.products import implementations
from sexpgpu.graph.core.emit import Emitter
from sexpgpu.graph.training.stacking import stack_training
from sexpgpu.backends.cuda.convolutions import ConvolutionKey, convolution_key, graph_convolutions
from sexpgpu.plan.device import DeviceFacts, ProductShape, Throughput
from sexpgpu.plan.fit import held_on_device, running_gradients
from sexpgpu.backends.cuda.patterns import PATTERN_NAMES, patterns_line

TIMED_CALLS = 5  # each timing is the median of this many warm calls
PRODUCT_REPEATS = 10  # a product's launches captured this many times in the graph each timed replay runs
# how a convolution runs where cuDNN's frontend offers no engine (cudnn_engines.py)
ENGINES_OTHERWISE = "PyTorch's cuDNN convolutions with its first deterministic algorithm"
FMA_ROUNDS = 512  # multiply-adds per element of the flops kernel: arithmetic, not memory, bounds it
FLOPS_ELEMENTS = 1 << 24
COPY_BYTES = 1 << 28


def driver_version() -> str:
    """The CUDA driver API version (cuDriverGetVersion), e.g. "13000"; "unknown" without a driver."""
    try:
        library = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "unknown"
    version = ctypes.c_int()
    return str(version.value) if library.cuDriverGetVersion(ctypes.byref(version)) == 0 else "unknown"


class CudaProbe:
    def __init__(self, backend):  # a CudaBackend
        self.backend = backend
        self.torch = backend.torch
        self.device = backend.device
        self._operands_of = (None, {})  # (shape, operands): the last product timed's

    # --- facts and memory -----------------------------------------------------------------------

    def device_facts(self) -> DeviceFacts:
        import triton

        torch = self.torch
        properties = torch.cuda.get_device_properties(self.device)
        torch.ones(1, 1, device=self.device) @ torch.ones(1, 1, device=self.device)  # loads cuBLAS
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        libraries = {"cuBLAS": cublas_version()}
        if cudnn is not None:
            libraries["cuDNN"] = str(cudnn)
        libraries["Triton"] = triton.__version__  # the generated kernels' compiler
        return DeviceFacts(gpu=properties.name, compute=f"compute_{properties.major}{properties.minor}",
                           multiprocessors=properties.multi_processor_count, driver=driver_version(),
                           libraries=libraries, patterns=self.backend.policy.patterns, pattern_names=PATTERN_NAMES,
                           engine_library="cuDNN", engines_otherwise=ENGINES_OTHERWISE)

    def free_memory_bytes(self) -> int:
        free, _ = self.torch.cuda.mem_get_info(self.device)
        return int(free)

    def training_peak_bytes(self, training, degree: int) -> int:
        """The arenas of the stacked microbatch graph and the update graph (each held for the
        run), and what lives outside them: the microbatch graph's inputs and outputs, a
        second set of gradients for the running sum, and the update's inputs and outputs."""
        micro = stack_training(training, degree).micro
        return held_on_device((micro, training.update), self.backend.memory_peak, running_gradients(micro))

    # --- timings --------------------------------------------------------------------------------

    def time_training_step(self, training, degree: int, inputs) -> float:
        """Seconds of a step's microbatch calls at `degree`: :microbatches / degree calls of
        the stacked graph and the sum of their gradients, as the run loop makes them.
        `inputs` are one microbatch's inputs of the unstacked graph (param/..., field/...,
        step); each call's fields are them repeated `degree` times. The update is left out:
        it is the same at every degree."""
        micro = stack_training(training, degree).micro
        call = {name: self._stacked(value, degree) if name.startswith("field/") else value
                for name, value in inputs.items() if name in micro.inputs}
        calls = training.microbatches // degree

        def step():
            total = None
            for _ in range(calls):
                outputs = self.backend.run(micro, call)
                grads = [value for name, value in outputs.items() if name.startswith("grad/")]
                total = grads if total is None else [a + b for a, b in zip(total, grads)]

        return self._median_seconds(step)

    def product_shapes(self, graph) -> tuple:
        """The float32 products of `graph` as lowered here, each shape once, in launch order:
        the keys a products map may name for it."""
        shapes = [launch.product for launch in self.backend.lowered(graph).launches if getattr(launch, "product", None)]
        return tuple(dict.fromkeys(shapes))

    def product_implementations(self, shape: ProductShape) -> tuple:
        return implementations(shape)

    def time_product(self, shape: ProductShape, implementation: str) -> float:
        """Seconds of the implementation's launches alone, replayed: a call would add copies in
        and out that cost every implementation the same and hide the differences between
        them (the shortest of TIMED_CALLS replays of PRODUCT_REPEATS products each)."""
        graph = product_graph(shape)
        # a backend of the same kind with the candidate's policy: the run's own is left as it is
        backend = type(self.backend)(str(self.device), replace(self.backend.policy, products={shape.key(): implementation}))
        env = backend.launch_environment(graph, self._operands(shape, graph))
        launches = backend.lowered(graph).launches
        return self._shortest_replay(lambda: [launch(env) for launch in launches]) / PRODUCT_REPEATS

    def _operands(self, shape: ProductShape, graph) -> dict:
        """Normal operands for a shape's product, drawn on the device once and shared by its
        implementations' timings (drawing a long product's operands on the host costs seconds)."""
        if self._operands_of[0] != shape:
            generator = self.torch.Generator(device=self.device).manual_seed(0)
            self._operands_of = (shape, {name: self.torch.randn(node.shape, device=self.device, generator=generator)
                                         for name, node in graph.inputs.items()})
        return self._operands_of[1]

    def convolution_keys(self, graph) -> tuple:
        """The convolutions the lowering runs as convolutions: not those a pattern graph
        computes with their epilogues."""
        if "convolutions" not in self.backend.policy.patterns:
            return graph_convolutions(graph)
        lowered = self.backend.lowered(graph)
        keys = (convolution_key(node) for node in lowered.graph.nodes if node not in lowered.covered)
        return tuple(dict.fromkeys(key for key in keys if key is not None))

    def patterns_line(self, graphs) -> str:
        uses = [use for graph in graphs for use in self.pattern_uses(graph)]
        return patterns_line(self.backend.patterns, uses)

    def pattern_uses(self, graph) -> tuple:
        """What the lowering of `graph` does with each group a pattern on matches (patterns.py's
        PatternUse): cuDNN's graph computes it, or cuDNN declines it."""
        return self.backend.lowered(graph).patterns if self.backend.policy.patterns else ()

    def convolution_engines(self, key: ConvolutionKey) -> tuple:
        """cuDNN's offered plans for the convolution (cudnn_engines.py), built once a process."""
        return cudnn_engines.offered(key, self._device_index())

    def convolutions_unavailable(self) -> str | None:
        return cudnn_engines.unavailable()

    def time_convolution(self, key: ConvolutionKey, engine: str) -> float:
        """The engine's plan on normal operands drawn on the device, into a buffer of its own."""
        torch = self.torch
        plan = cudnn_engines.prepared(key, engine, self._device_index())
        dtype = torch.bfloat16 if key.dtype == "bf16" else torch.float32
        generator = torch.Generator(device=self.device).manual_seed(0)
        first, second, result = (torch.randn(shape, device=self.device, generator=generator).to(dtype)
                                 for shape in cudnn_engines.operand_shapes(key))
        workspace = torch.empty(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=self.device)
        return self._median_seconds(lambda: plan.run(first, second, result, workspace))

    def _device_index(self) -> int:
        return self.device.index if self.device.index is not None else self.torch.cuda.current_device()

    def measure_throughput(self) -> Throughput:
        """float32 multiply-adds a second of a kernel that does FMA_ROUNDS of them per loaded
        element, and bytes a second of a copy (read and write) of COPY_BYTES: a few milliseconds
        once the kernel is compiled."""
        # imported here: Triton reads TRITON_INTERPRET when it decorates the kernel
        from sexpgpu.backends.cuda.throughput import copy_work, fma_work

        flops = 2.0 * FMA_ROUNDS * FLOPS_ELEMENTS / self._median_seconds(fma_work(self.device, FLOPS_ELEMENTS, FMA_ROUNDS))
        bandwidth = 2.0 * COPY_BYTES / self._median_seconds(copy_work(self.device, COPY_BYTES))
        return Throughput(flops, bandwidth)

    def _stacked(self, value, degree: int):
        """A field of one microbatch as `degree` microbatches' (the values do not matter to a timing)."""
        array = self.backend.to_host(value)
        return self.backend.from_host(np.concatenate([array] * degree) if degree > 1 else array)

    def _shortest_replay(self, work) -> float:
        """Seconds of the shortest of TIMED_CALLS replays of `work` captured PRODUCT_REPEATS
        times over as one CUDA graph (run once eagerly first: it compiles and warms up)."""
        torch = self.torch
        work()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            work()  # a warm-up on the capture stream, as PyTorch asks
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(PRODUCT_REPEATS):
                work()
        return min(self._event_seconds(graph.replay) for _ in range(TIMED_CALLS))

    def _event_seconds(self, work) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def _median_seconds(self, work) -> float:
        torch = self.torch
        work()  # compiles, allocates and warms cuBLAS up
        return statistics.median(self._event_seconds(work) for _ in range(TIMED_CALLS))


def product_graph(shape: ProductShape):
    """A graph of one product of `shape`, its operands stored in the shape's layouts."""
    e = Emitter()
    lead = (shape.batch,) if shape.batch > 1 else ()
    inputs, operands = {}, []
    for name, rows, cols, transposed in (("a", shape.m, shape.k, shape.a_transposed), ("b", shape.k, shape.n, shape.b_transposed)):
        node = inputs[name] = e.input(name, "f32", lead + ((cols, rows) if transposed else (rows, cols)))
        if transposed:
            node = e("transpose", node, perm=tuple(range(len(lead))) + (len(lead) + 1, len(lead)))
        operands.append(node)
    return e.graph(inputs, {"c": e("matmul", *operands)})
