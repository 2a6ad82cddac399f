"""Running a lowered graph: the arena, the environment of buffers, and CUDA graph capture.

`Executable` allocates the memory plan's arena once and runs the steps eagerly. `Captured`
records the same steps as one CUDA graph: its inputs and outputs are static buffers (some
of them inside the arena, placement.py), each call copies the inputs in, replays, and
returns copies of the outputs, or, to a caller that takes them lent, the output buffers
themselves (`lendable`). Inputs that come back as the outputs of the last replay, lent, at
the same places of another arena buffer (the optimizer's parameters and state: slices of its
flat results, then slices of its flat inputs) come in with one copy of that whole buffer
(`Returned`), not one copy each. Scalars such as the
step and the learning rate are inputs like any other, read by the kernels from device
memory, so a replay sees this call's values (a draw folds its salts into its key there). Replaying launches the same kernels with the
same configurations on the same addresses, so it gives the eager run's bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from sexpgpu.backends.cuda.placement import placements
from sexpgpu.backends.cuda.steps import DEVICE, strided, torch_dtype
from sexpgpu.errors import SexpgpuError


def allocation_failed(what: str, nbytes: int, error) -> SexpgpuError:
    return SexpgpuError(
        "E-MEM-001",
        f"memory: allocation failed: {what} needs {nbytes:,} bytes of GPU memory and the device has "
        f"no room for them ({str(error).splitlines()[0]}).",
        hint="Use a smaller :batch, free the GPU of other processes, or run with --device cpu.",
    )


def allocate(shape, dtype, device, what: str):
    """torch.empty, with the spec's allocation-failure stop instead of PyTorch's error."""
    import torch

    dtype = torch_dtype(dtype) if isinstance(dtype, str) else dtype
    try:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    except torch.cuda.OutOfMemoryError as error:
        count = dtype.itemsize
        for size in shape:
            count *= int(size)
        raise allocation_failed(what, count, error) from None


class Executable:
    def __init__(self, lowered, device):
        self.lowered = lowered
        self.device = device
        import torch

        arena = allocate((max(lowered.arena_bytes, 1),), torch.uint8, device, "the memory plan's arena")
        self.fixed = {}
        for key, offset in lowered.offsets.items():
            buffer = lowered.buffers[key]
            piece = arena[offset:offset + buffer.nbytes].view(torch_dtype(buffer.dtype))
            self.fixed[key] = piece.view(buffer.shape)
        self.fixed.update(_constants(lowered, device))
        self.arena = arena

    def output_buffers(self, skip=()) -> dict:
        outputs = {}
        for name, key in self.lowered.outputs.items():
            if key in skip or self.lowered.buffers[key].kind == "accumulator":  # a step makes those
                continue
            buffer = self.lowered.buffers[key]
            outputs[key] = allocate(buffer.shape, buffer.dtype, self.device, f"output {name}")
        return outputs

    def static_environment(self, inputs: dict) -> dict:
        """The buffers for replays: a copy of each input, an output buffer for each output,
        those that placement.py allows inside the arena."""
        env = dict(self.fixed)
        placed = placements(self.lowered)
        env.update({key: strided(env, target, view) for key, (target, view) in placed.items()})
        env.update(self.output_buffers(skip=placed))
        for name, key in self.lowered.inputs.items():
            env[key] = env[key].copy_(inputs[name]) if key in env else inputs[name].clone()
        return env

    def execute(self, env: dict) -> None:
        for step in self.lowered.steps:
            step(env)

    def __call__(self, inputs: dict, lent: bool = False) -> dict:
        """The outputs, in buffers of their own: each call allocates them (`lent` changes nothing)."""
        env = dict(self.fixed)
        env.update({key: inputs[name] for name, key in self.lowered.inputs.items()})
        env.update(self.output_buffers())
        env[DEVICE] = self.device
        self.execute(env)
        return {name: env[key] for name, key in self.lowered.outputs.items()}


class Captured:
    """The executable as one CUDA graph, captured at the second call (the first compiles
    every kernel and warms cuBLAS up)."""

    def __init__(self, executable: Executable):
        self.executable = executable
        self.calls = 0
        self.graph = None
        self.env = None
        self.lendable = frozenset()  # outputs whose buffers may be handed out, not copied
        self.returned: tuple[Returned, ...] = ()

    def __call__(self, inputs: dict, lent: bool = False) -> dict:
        """The outputs. `lent`: the caller takes the lendable outputs as the graph's own
        buffers, which the next replay writes over; it reads them before that, and gives
        them back only as inputs (the optimizer's parameters and state, step after step),
        so a step does not copy them out."""
        self.calls += 1
        if self.calls == 1:
            return self.executable(inputs)
        if self.graph is None:
            self._capture(inputs)
        lowered = self.executable.lowered
        whole = self._copy_returned(inputs)
        _copy_all([self.env[key] for name, key in lowered.inputs.items() if name not in whole],
                  [inputs[name] for name in lowered.inputs if name not in whole])
        self.graph.replay()
        lend = self.lendable if lent else frozenset()
        return {name: self.env[key] if name in lend else self.env[key].clone()
                for name, key in lowered.outputs.items()}

    def _capture(self, inputs: dict) -> None:
        import torch

        env = self.executable.static_environment(inputs)
        stream = torch.cuda.Stream(self.executable.device)
        stream.wait_stream(torch.cuda.current_stream(self.executable.device))
        with torch.cuda.stream(stream):
            self.executable.execute(env)  # warm-up on the capture stream, as PyTorch asks
        torch.cuda.current_stream(self.executable.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            self.executable.execute(env)
        self.graph, self.env = graph, env
        self.lendable = _lendable(self.executable.lowered, env)
        self.returned = _returned(self.executable.lowered, placements(self.executable.lowered))

    def _copy_returned(self, inputs: dict) -> frozenset:
        """The names of the inputs that came back as the very buffers the last replay lent
        and lie all together in one arena buffer: each such buffer is copied in whole."""
        outputs = self.executable.lowered.outputs
        whole = set()
        for returned in self.returned:
            if all(inputs[name] is self.env[outputs[name]] for name in returned.names):
                self.env[returned.target].copy_(self.env[returned.source])
                whole.update(returned.names)
        return frozenset(whole)


@dataclass(frozen=True)
class Returned:
    """Inputs that lie in the arena buffer `target` at the very places where the outputs of
    their names lie in `source`, and fill it: one copy of `source` brings them all in."""

    names: tuple[str, ...]
    target: str
    source: str


def _returned(lowered, placed: dict) -> tuple[Returned, ...]:
    groups: dict = {}
    for name, key in lowered.inputs.items():
        output = lowered.outputs.get(name)
        if key in placed and output in placed and placed[key][1] == placed[output][1]:
            groups.setdefault((placed[key][0], placed[output][0]), []).append(name)
    found = []
    for (target, source), names in groups.items():
        into, out_of = lowered.buffers[target], lowered.buffers[source]
        covered = sum(prod(placed[lowered.inputs[name]][1].dims) for name in names)
        if target != source and into.shape == out_of.shape and into.dtype == out_of.dtype \
                and covered == prod(into.shape):
            found.append(Returned(tuple(names), target, source))
    return tuple(found)


def _lendable(lowered, env: dict) -> frozenset:
    """The outputs whose memory no input's buffer shares. Lent, an output may come back as
    any input of the next call; the copies in must not write over memory they read from."""
    slots = [_span(env[key]) for key in lowered.inputs.values()]
    return frozenset(name for name, key in lowered.outputs.items()
                     if not any(_overlap(_span(env[key]), slot) for slot in slots))


def _span(tensor) -> tuple[int, int]:
    """The bytes a contiguous buffer covers."""
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _constants(lowered, device) -> dict:
    """The constant buffers (a draw's key and parameters), on the device for the executable's
    life: copied there once, so no call, eager or replayed, copies them again."""
    import torch

    return {key: torch.tensor(buffer.values, dtype=torch_dtype(buffer.dtype)).reshape(buffer.shape).to(device)
            for key, buffer in lowered.buffers.items() if buffer.kind == "constant"}


def _copy_all(targets: list, sources: list) -> None:
    """Every source into its target with a few multi-tensor launches, not one launch (and
    a few microseconds of the host) per tensor: an optimizer graph has hundreds of inputs.
    One list per pair of dtypes: PyTorch takes its multi-tensor path only for a list whose
    tensors all share one dtype, and copies a mixed list (the step's int32 among float32
    parameters) tensor by tensor."""
    import torch

    lists: dict = {}
    for target, source in zip(targets, sources):
        pair = lists.setdefault((target.dtype, source.dtype), ([], []))
        pair[0].append(target)
        pair[1].append(source)
    for same_targets, same_sources in lists.values():
        torch._foreach_copy_(same_targets, same_sources)
