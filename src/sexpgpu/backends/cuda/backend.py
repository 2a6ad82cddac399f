"""The CUDA backend: the same contract as the CPU interpreter, on the GPU.

    backend = CudaBackend()
    outputs = backend.run(graph, {"param/w": tensor, "field/x": array, "step": 3, ...})

Inputs may be numpy arrays, Python numbers or tensors; they are checked against the graph's
inputs exactly as the interpreter checks them (no silent casts). Outputs are device tensors;
`to_host` brings one back as the interpreter's numpy array (bf16 values as float32).

Each graph is lowered once (lowering.py) and kept; with SEXPGPU_OPTIMIZE=on it is captured
as a CUDA graph at its second run (draws included: their keys are folded on the device),
unless it is exact (exact sums read counts back). `device="cpu"` runs
the same lowering on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1): that is
how CI checks the lowering without a GPU.

Exact graphs (graph/passes/exact_region.py: `:arithmetic exact` runs) lower by exact.py: every
sum exact and rounded once, the interpreter's bits on any device. Their graphs return a
parameter's gradient unrounded (acc), as a `PendingSum` of views of the graph's memory; a step
adds and rounds them with graphs of acc values alone (graph/passes/exact_region.py's
GradientSums), which run on the host's side of the device (backends/exact_sums.py's
`evaluated`; a rounding graph by `rounding`, captured_sums.py). Before a graph runs again,
over that memory, the backend forms the digits of the sums still held.

A backend made without a policy takes the environment's (SEXPGPU_OPTIMIZE) with the patterns
the plan puts on here (backends/cuda/patterns.py's `decide_patterns`: SEXPGPU_PATTERNS and what cuDNN
supports on this device, cudnn_patterns.py); `patterns` says which and why the others are off.
A policy given is taken as it is, its patterns included (none by default).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import replace

import numpy as np

from sexpgpu import settings
from sexpgpu.backends.contract import BackendDefaults, check_input_names, check_input_shape, host_input
from sexpgpu.backends.exact_sums import PendingSum, evaluated, on_host
from sexpgpu.backends.cuda import device as device_settings
from sexpgpu.backends.cuda.captured_sums import CapturedSums
from sexpgpu.backends.cuda.cudnn_patterns import support
from sexpgpu.backends.cuda.fusion import policy_from_environment
from sexpgpu.backends.cuda.lowering import lower
from sexpgpu.backends.cuda.probe import CudaProbe
from sexpgpu.backends.cuda.runtime import Captured, Executable, LentBuffers, allocation_failed
from sexpgpu.backends.cuda.launches import DEVICE, torch_dtype
from sexpgpu.errors import SexpgpuError
from sexpgpu.exact.implementations import device_paths
from sexpgpu.backends.cuda.patterns import PATTERN_NAMES, PatternsInEffect, decide_patterns

GIVEN = "the backend was made with a policy without it"
# launch_seconds: launches queued behind one sleep of the GPU, and its length (about 20 ms at
# an H200's clock: the host's Python for 64 launches, a few hundred microseconds each at most)
TIMED_GROUP = 64
SLEEP_CYCLES = 40_000_000


class CudaBackend(BackendDefaults):
    name = "cuda"
    takes_choices = True

    def __init__(self, device: str | None = None, policy=None):
        device_settings.configure()
        import torch

        self.torch = torch
        self.device = torch.device(device or "cuda")
        if policy is None:
            self.patterns = patterns_here(self.device)
            policy = replace(policy_from_environment(), patterns=self.patterns.on)
        else:
            self.patterns = decide_patterns(None, {name: None if name in policy.patterns else GIVEN
                                                   for name in PATTERN_NAMES})
        self.policy = policy
        # on CPU tensors (Triton's interpreter) the exact library takes the paths a GPU takes
        self.exact_paths = device_paths if self.device.type == "cpu" else contextlib.nullcontext
        # an exact step's gradients rounded once, on the device where the update graph reads them
        self.rounding = CapturedSums(self.device)
        # CUDA graphs from a graph's second call where the policy fuses; False keeps every call
        # eager, for timing the launches inside one (bench/exact_calls.py)
        self.capture = True
        self._pending: dict = {}  # id(graph) -> the PendingSums its last run returned (weakly)
        self._runners: dict = {}
        self._lowerings: dict = {}
        # the buffers its captured graphs lend: one graph reads another's where they lie
        self.lent_buffers = LentBuffers()

    # --- the contract ---------------------------------------------------------------------------
    def take_choices(self, choices) -> None:
        """Lower from now on as the plan decided (plan/choices.py's Choices): its recompute
        budget, each float32 product's implementation and each convolution's cuDNN engine.
        Lowerings made before are dropped."""
        budget = choices.recompute if choices.recompute is not None else self.policy.budget
        self.policy = replace(self.policy, budget=budget, products=dict(choices.products or {}),
                              convolutions=dict(choices.convolutions or {}))
        self._runners.clear()
        self.rounding.release()
        self._lowerings.clear()

    def run(self, graph, inputs: dict, lent: bool = False) -> dict:
        """The graph's outputs. A device allocation that fails, the arena's or any launch's,
        raises E-MEM-001 and leaves the backend usable: the graph's memory is let go, so the
        caller may go on with a smaller graph (the run loop's unstacked steps). `lent`: a
        captured graph may return its own output buffers (runtime.py's Captured)."""
        check_input_names(graph, inputs)
        with self.exact_paths():
            if on_host(graph):  # an exact step's sums across its calls
                return self._host_sums(graph, inputs)
            self._form_pending(graph)
            return self._run(graph, inputs, lent)

    def _host_sums(self, graph, inputs: dict) -> dict:
        """A graph of acc values alone; the rounding of a step's gradients, one name each, by
        `rounding`, which captures it where the sums lie over a captured graph's buffers."""
        names = {node: name for name, node in graph.inputs.items()}
        if all(node.op == "round" and node.dtype == "f32" and names.get(node.inputs[0]) == name
               for name, node in graph.outputs.items()):
            return self.rounding.rounded({name: inputs[name] for name in graph.outputs})
        return evaluated(graph, inputs)

    def _run(self, graph, inputs: dict, lent: bool) -> dict:
        try:
            accepted = {name: self._accept(name, node, inputs[name]) for name, node in graph.inputs.items()}
            runner = self._entry(graph)[2]
            outputs = runner(accepted, lent)
            pending = {name: value for name, value in outputs.items() if isinstance(value, PendingSum)}
            if pending:
                self._pending[id(graph)] = weakref.WeakSet(pending.values())
                if isinstance(runner, Captured) and runner.graph is not None:
                    for name, value in pending.items():  # over the replay's buffers, which stay
                        value.origin = (runner, name) if value.fixed else None
            return outputs
        except self.torch.cuda.OutOfMemoryError as error:
            self.release(graph)
            raise allocation_failed("the graph (its arena and a launch's own memory)", self.memory_peak(graph), error) from None
        except SexpgpuError as error:
            if error.code == "E-MEM-001":
                self.release(graph)
            raise

    def _form_pending(self, graph) -> None:
        """The digits of every sum the graph's last run returned unformed and that is still
        held (the run loop adding microbatches): this run writes over what they read."""
        for pending in self._pending.pop(id(graph), ()):
            pending.accumulator()

    def release(self, graph) -> None:
        """Let go of the device memory held for `graph` (its arena and captured buffers, and
        every captured rounding); a later run of it allocates them again."""
        self._runners.pop(id(graph), None)
        self.rounding.release()
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()

    def lowered(self, graph):
        """The lowering of `graph` (launches, buffers, arena size), made once; making it
        allocates nothing."""
        entry = self._lowerings.get(id(graph))
        if entry is None or entry[0] is not graph:
            entry = (graph, lower(graph, self.policy))
            self._lowerings[id(graph)] = entry
        return entry[1]

    def cast_parameter(self, array, dtype: str):
        """A float32 starting value stored as a parameter of `dtype` (bf16: rounded to
        nearest even, the interpreter's rounding)."""
        from sexpgpu.backends.cpu.arith import round_bf16

        array = _c_order(np.asarray(array, dtype=np.float32))
        if dtype == "bf16":
            with self._allocating("a bf16 parameter", array.nbytes // 2):
                return self.from_host(round_bf16(array)).to(self.torch.bfloat16)
        return self.from_host(array)

    def to_host(self, value) -> np.ndarray:
        if not isinstance(value, self.torch.Tensor):
            return np.asarray(value)
        if value.dtype == self.torch.bfloat16:
            value = value.float()
        return value.detach().cpu().numpy()

    def fingerprints(self, values: list) -> list[int]:
        """Each parameter's 64-bit fingerprint, computed on the GPU: the CPU's bits
        (backends/cpu/fingerprint.py), with one small copy to the host."""
        from sexpgpu.backends.cuda.fingerprint import fingerprints

        return fingerprints(values)

    def from_host(self, array):
        array = _c_order(np.asarray(array))
        with self._allocating("a tensor copied from the host", array.nbytes):
            return self.torch.from_numpy(array).to(self.device)

    @contextlib.contextmanager
    def _allocating(self, what: str, nbytes: int):
        """E-MEM-001 for an allocation outside a graph's run that finds the device full."""
        try:
            yield
        except self.torch.cuda.OutOfMemoryError as error:
            raise allocation_failed(what, nbytes, error) from None

    def facts(self) -> dict:
        return device_settings.facts(self.device, self.policy)

    def probe(self) -> CudaProbe | None:
        """The GPU's probe; None on host tensors (under Triton's interpreter), whose room is the host's."""
        return CudaProbe(self) if self.device.type == "cuda" else None

    def profile(self, graph, inputs: dict) -> dict:
        """Seconds per kind of launch (matmul, elementwise, rows, ...) of one eager run of
        `graph`: where a launch's time goes."""
        seconds: dict = {}
        for launch, spent in self.launch_seconds(graph, inputs):
            seconds[launch.kind] = seconds.get(launch.kind, 0.0) + spent
        return seconds

    def launch_seconds(self, graph, inputs: dict) -> list:
        """[(launch, seconds)] of one eager run of `graph`, each launch timed with CUDA events.
        The GPU first sleeps while the host queues a group of launches, so that an event pair
        times the launch's kernels and not the host's Python between them (tens of
        microseconds, more than many a kernel takes)."""
        torch = self.torch
        env = self.launch_environment(graph, inputs)
        launches, marks = self.lowered(graph).launches, []
        for first in range(0, len(launches), TIMED_GROUP):
            torch.cuda.synchronize(self.device)
            torch.cuda._sleep(SLEEP_CYCLES)
            for launch in launches[first : first + TIMED_GROUP]:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                launch(env)
                end.record()
                marks.append((launch, start, end))
        torch.cuda.synchronize(self.device)
        return [(launch, start.elapsed_time(end) / 1e3) for launch, start, end in marks]

    def launch_environment(self, graph, inputs: dict) -> dict:
        """The buffers the lowered launches of `graph` read and write, the inputs in them: for
        running or timing its launches one by one, outside a call."""
        check_input_names(graph, inputs)
        executable = self._entry(graph)[1]
        env = dict(executable.fixed)
        env.update({key: self._accept(name, graph.inputs[name], inputs[name])
                    for name, key in executable.lowered.inputs.items()})
        env.update(executable.output_buffers())
        env[DEVICE] = self.device
        return env

    def memory_peak(self, graph) -> int:
        """Bytes of the graph's arena: every intermediate buffer at its planned offset."""
        return self.lowered(graph).arena_bytes

    # --- inside ------------------------------------------------------------------------------------

    def _entry(self, graph):
        entry = self._runners.get(id(graph))
        if entry is None or entry[0] is not graph:
            executable = Executable(self.lowered(graph), self.device)
            # runtime.host_split says whether the launches allow it; a read back refuses it at capture
            capture = self.capture and self.policy.fuses and self.device.type == "cuda"
            entry = (graph, executable, Captured(executable, self.lent_buffers) if capture else executable)
            self._runners[id(graph)] = entry
        return entry

    def is_captured(self, graph) -> bool:
        """Whether `graph`'s calls now replay a CUDA graph (runtime.Captured)."""
        entry = self._runners.get(id(graph))
        return entry is not None and isinstance(entry[2], Captured) and entry[2].graph is not None

    def _accept(self, name: str, node, value):
        """The input as a device tensor of the node's storage dtype, checked like the
        interpreter checks it."""
        torch = self.torch
        want = torch_dtype(node.dtype)
        if isinstance(value, torch.Tensor):
            tensor = value
            if tensor.dtype != want and not (node.dtype == "bf16" and tensor.dtype == torch.float32):
                raise TypeError(f"input {name}: {tensor.dtype} tensor for a {node.dtype} input")
            checked = False
        else:
            array = _c_order(host_input(name, node, value))
            if node.dtype == "bf16":
                _check_bf16(name, array)
            tensor, checked = torch.from_numpy(array), True
        check_input_shape(name, node, tensor.shape)
        if checked and self.device.type == "cuda":
            # a copy from pageable memory waits for every kernel already queued (CUDA's rule);
            # from pinned memory it is queued behind them, and the host goes on to the next graph
            tensor = tensor.pin_memory()
        tensor = tensor.to(self.device, non_blocking=True)
        if node.dtype == "bf16" and tensor.dtype == torch.float32:
            narrowed = tensor.to(torch.bfloat16)
            if not checked and not torch.equal(narrowed.float(), tensor):
                raise ValueError(f"input {name} is bf16 but holds values that are not bfloat16")
            tensor = narrowed
        return tensor.contiguous()


def _c_order(array: np.ndarray) -> np.ndarray:
    """The array in C order, keeping its rank (np.ascontiguousarray makes a scalar 1-d)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def _check_bf16(name: str, array: np.ndarray) -> None:
    """A float32 host array for a bf16 input must hold bf16 values, and no NaN: checked on
    the host, since a check on the device would wait for the GPU."""
    if np.any((array.view(np.uint32) & 0xFFFF) != 0) or np.any(np.isnan(array)):
        raise ValueError(f"input {name} is bf16 but holds values that are not bfloat16")


def patterns_here(device) -> PatternsInEffect:
    """The patterns the plan puts on for this device: SEXPGPU_PATTERNS and cuDNN's support."""
    return decide_patterns(settings.value("SEXPGPU_PATTERNS"), support(device))
