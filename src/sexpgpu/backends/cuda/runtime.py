"""Running a lowered graph: the arena, the environment of buffers, and CUDA graph capture.

`Executable` allocates the memory plan's arena once and runs the launches eagerly. `Captured`
records the same launches as one CUDA graph: its inputs and outputs are static buffers (some
of them inside the arena, placement.py), each call copies the inputs in, replays, and
returns copies of the outputs, or, to a caller that takes them lent, the output buffers
themselves (`lendable`). The optimizer's update is made in place (placement.in_place): its new
parameters and moments lie in the very slots of the inputs of their names, so those that come
back lent as the inputs of their own names are where they must be and are not copied at all
(`InPlace`); any other tensor lying in those slots is cloned first, as the copies in would write
over it. Inputs that come back as the outputs of the last replay, lent, at the same places of
another arena buffer (an update not made in place) come in with one copy of that whole buffer
(`Returned`), not one copy each. An input that another captured graph of the backend lent
(`LentBuffers`: the update's parameters, read by the next microbatch) is read where it lies
(`Binding`): the static environment holds that very tensor, so a call given it copies nothing,
and its lender's replays keep it current; the lender's memory is never copied into, so another
tensor for such a name makes the graph capture again, that name copied from then on. Scalars
such as the step and the learning rate are inputs like any other, read by the kernels from
device memory, so a replay sees this call's values (a draw folds its salts into its key there).
Replaying launches the same kernels with the same configurations on the same addresses, so it
gives the eager run's bits.

An exact graph is captured too: its sums on the device read nothing back (exact/queued.py).
What must run on the host each call is split out (`host_split`): the id checks, which read
the call's inputs, run before the replay; the gradient region, whose launches make pending sums
over the buffers the replay fills, after it. Launches that still wait for the device (a bf16
result's sums, an exact accumulator's special-value count) are found in the warm-up before
the capture, and such a graph runs eagerly.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from math import prod

from sexpgpu.backends.cuda.codegen.space import contiguous_strides
from sexpgpu.backends.cuda.placement import placements
from sexpgpu.backends.cuda.launches import DEVICE, same_memory, strided, torch_dtype
from sexpgpu.backends.spans import byte_span, spans_meet
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
            if key in skip or self.lowered.buffers[key].kind == "accumulator":  # a launch makes those
                continue
            buffer = self.lowered.buffers[key]
            outputs[key] = allocate(buffer.shape, buffer.dtype, self.device, f"output {name}")
        return outputs

    def static_environment(self, inputs: dict, bound: dict | None = None) -> dict:
        """The buffers for replays: a copy of each input, an output buffer for each output,
        those that placement.py allows inside the arena. `bound`: inputs by name taken as they
        are, not copied (another captured graph's lent buffers, `Binding`)."""
        import torch

        bound = bound or {}
        env = dict(self.fixed)
        placed = placements(self.lowered)
        env.update({key: strided(env, target, view) for key, (target, view) in placed.items()})
        env.update(self.output_buffers(skip=placed))
        for name, key in self.lowered.inputs.items():
            if name in bound:
                env[key] = bound[name]
            elif key in env:
                env[key] = env[key].copy_(inputs[name])
            else:  # a slot is read as a contiguous buffer, whatever the strides of the first input
                env[key] = inputs[name].clone(memory_format=torch.contiguous_format)
        env[DEVICE] = self.device
        return env

    def execute(self, env: dict) -> None:
        _run_launches(self.lowered.launches, env)

    def __call__(self, inputs: dict, lent: bool = False) -> dict:
        """The outputs, in buffers of their own: each call allocates them (`lent` changes nothing)."""
        env = dict(self.fixed)
        env.update({key: inputs[name] for name, key in self.lowered.inputs.items()})
        env.update(self.output_buffers())
        env[DEVICE] = self.device
        self.execute(env)
        return {name: env[key] for name, key in self.lowered.outputs.items()}


BEFORE_REPLAY = frozenset({"check"})  # host launches over the call's inputs (an id check reads them back)
AFTER_REPLAY = frozenset({"exact-region", "hold"})  # host launches over what the replay wrote (pending sums)


@dataclass(frozen=True)
class HostSplit:
    """An executable's launches for capture: `before` run on the host ahead of each replay,
    `device` captured, `after` run on the host once the replay is queued."""

    before: tuple
    device: tuple
    after: tuple

    @property
    def host_values(self) -> frozenset:
        """The keys the host launches after the replay write: each call's own values. Kept in the
        static environment, a call's pending sums would stay alive, and the backend would form
        their digits before every later call."""
        return frozenset(key for launch in self.after for key in launch.writes)


def host_split(lowered) -> HostSplit | None:
    """The split of `lowered`'s launches, or None when it cannot be captured: a check that reads
    anything but the call's inputs (it would see the last replay's values), or a captured launch
    that reads what a host launch after the replay writes. An exact graph's gradient region is
    such a host launch: each call makes its pending sums anew over the buffers the replay filled,
    which its "hold" launch keeps to the end."""
    before = tuple(launch for launch in lowered.launches if launch.kind in BEFORE_REPLAY)
    after = tuple(launch for launch in lowered.launches if launch.kind in AFTER_REPLAY)
    device = tuple(launch for launch in lowered.launches if launch.kind not in BEFORE_REPLAY | AFTER_REPLAY)
    inputs = set(lowered.inputs.values())
    split = HostSplit(before, device, after)
    if any(key not in inputs for launch in before for key in launch.reads):
        return None
    if any(key in split.host_values for launch in device for key in launch.reads):
        return None
    return split


class Captured:
    """The executable as one CUDA graph, captured at the second call (the first compiles
    every kernel and warms cuBLAS up). Host launches (HostSplit) run around each replay. A
    graph whose launches wait for the device (a count read back), found in the warm-up before
    the capture, or whose capture fails, runs eagerly from then on."""

    def __init__(self, executable: Executable, lent_buffers: LentBuffers | None = None):
        self.executable = executable
        self.calls = 0
        self.graph = None
        self.env = None
        self.lendable = frozenset()  # outputs whose buffers may be handed out, not copied
        self.returned: tuple[Returned, ...] = ()
        self.updated = InPlace(frozenset(), ())
        self.split = host_split(executable.lowered)
        self.eager = self.split is None
        # the buffers this graph and the others of its backend lend, and which of them it reads as they lie
        self.lent_buffers = lent_buffers if lent_buffers is not None else LentBuffers()
        self.bindable = frozenset() if self.eager else _bindable(executable.lowered, self.split)
        self.binding = Binding({}, frozenset(), frozenset())

    def __call__(self, inputs: dict, lent: bool = False) -> dict:
        """The outputs. `lent`: the caller takes the lendable outputs as the graph's own
        buffers, which the next replay writes over; it reads them before that, and gives
        them back only as inputs (the optimizer's parameters and state, step after step),
        so a step does not copy them out, nor, where the update is made in place, in."""
        self.calls += 1
        if self.calls == 1 or self.eager:
            return self.executable(inputs)
        if self.graph is not None:
            self._rebind(inputs)
        if self.graph is None and not self._capture(inputs):
            self.eager = True
            return self.executable(inputs)
        lowered = self.executable.lowered
        settled = self.updated.settled(inputs, self.env, lowered.outputs)
        inputs = self.updated.detached(inputs, settled)
        kept = settled | self._copy_returned(inputs) | self.binding.names
        _copy_all([self.env[key] for name, key in lowered.inputs.items() if name not in kept],
                  [inputs[name] for name in lowered.inputs if name not in kept])
        _run_launches(self.split.before, self.env)
        self.replay()
        _run_launches(self.split.after, self.env)
        lend = self.lendable if lent else frozenset()
        outputs = {name: self.env[key] if name in lend or not _is_buffer(lowered, key) else self.env[key].clone()
                   for name, key in lowered.outputs.items()}
        for key in self.split.host_values:  # the call's pending sums belong to its caller alone
            self.env.pop(key, None)
        return outputs

    def replay(self) -> None:
        self.graph.replay()

    def _rebind(self, inputs: dict) -> None:
        """Drop the CUDA graph, to be captured again from this call's inputs, where a bound input
        comes as another tensor (never copied into: the memory is its lender's, which the caller
        may still hold; that name is never bound again) or one that may be bound comes lent."""
        moved = self.binding.moved(inputs)
        if moved or self.binding.newly_lent(inputs, self.lent_buffers, self):
            self.binding = self.binding.barring(moved)
            self.graph = None

    def _capture(self, inputs: dict) -> bool:
        """Capture the device launches; False (nothing kept) where they wait for the device."""
        verdicts = {name: self._verdict(name, inputs[name]) for name in self.bindable - self.binding.barred}
        binding = Binding.of(inputs, verdicts, self.binding.barred)
        env = self.executable.static_environment(inputs, binding.bound)
        graph = self._recorded(env)
        if graph is None:
            return False
        self.graph = graph
        self.binding = binding
        self.adopt(env)
        return True

    def _verdict(self, name: str, tensor) -> str:
        """Binding's word for `tensor` given for the input `name`: "bound" where another graph
        lends it in the slot's layout; "open" where no graph lends it (it may come lent later);
        "barred" where this graph lends it (an update in place takes its own, `InPlace`) or it
        comes in another layout."""
        lender = self.lent_buffers.lender(tensor)
        if lender is None:
            return "open"
        lowered = self.executable.lowered
        fits = _fits(tensor, lowered.buffers[lowered.inputs[name]], self.executable.arena.device)
        return "bound" if lender is not self and fits else "barred"

    def adopt(self, env: dict) -> None:
        """`env` as the replays' static environment, and what its buffers' places allow; the
        lendable outputs are told to the backend's other graphs, which may read them as they lie."""
        lowered = self.executable.lowered
        self.env = env
        self.lendable = _lendable(lowered, env)
        self.returned = _returned(lowered, placements(lowered))
        self.updated = InPlace.of(lowered, env)
        self.lent_buffers.lend(self, [env[lowered.outputs[name]] for name in self.lendable])

    def _recorded(self, env: dict):
        """The device launches over `env` as a CUDA graph, or None if one waits for the device."""
        import torch

        stream = torch.cuda.Stream(self.executable.device)
        stream.wait_stream(torch.cuda.current_stream(self.executable.device))
        try:
            with torch.cuda.stream(stream):  # warm-up on the capture stream, as PyTorch asks
                _run_launches(self.split.before, env)
                with waits_refused(torch):
                    _run_launches(self.split.device, env)
            torch.cuda.current_stream(self.executable.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                _run_launches(self.split.device, env)
        except RuntimeError:  # a read back: PyTorch refuses it in the warm-up or in the capture
            torch.cuda.synchronize(self.executable.device)
            return None
        return graph

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


class LentBuffers:
    """The tensors the captured graphs of one backend lend, each with the graph lending it: the
    same objects at every call, which its replays keep current. Held weakly, so that a graph
    let go (CudaBackend.release) and its buffers are freed; known by identity, so that a
    lookup per input is all a call pays."""

    def __init__(self):
        self._lent: dict[int, _Lent] = {}

    def lend(self, lender, tensors) -> None:
        """`tensors` lent by `lender` from now on, in place of what it lent before."""
        self._lent = {key: lent for key, lent in self._lent.items()
                      if lent.tensor() is not None and lent.lender() not in (None, lender)}
        self._lent.update({id(tensor): _Lent(weakref.ref(tensor), weakref.ref(lender)) for tensor in tensors})

    def lender(self, tensor):
        """The graph lending `tensor`, or None."""
        lent = self._lent.get(id(tensor))
        return lent.lender() if lent is not None and lent.tensor() is tensor else None


@dataclass(frozen=True)
class _Lent:
    tensor: weakref.ref
    lender: weakref.ref


@dataclass(frozen=True)
class Binding:
    """A captured graph's inputs read where another captured graph lent them. `bound`: by name,
    the lent tensor, which the static environment holds as the input's buffer (nothing copied at
    capture nor at a call given that very tensor); `open`: names that a later capture may bind,
    given no lent tensor so far; `barred`: names never bound (given another tensor once bound, or
    lent in a layout the slot has not)."""

    bound: dict
    open: frozenset
    barred: frozenset

    @classmethod
    def of(cls, inputs: dict, verdicts: dict, barred: frozenset) -> "Binding":
        """The binding of a capture from `inputs`, given each name's verdict ("bound", "open" or
        "barred") and the names barred before."""
        def named(verdict: str) -> frozenset:
            return frozenset(name for name, said in verdicts.items() if said == verdict)

        return cls({name: inputs[name] for name in named("bound")}, named("open"), barred | named("barred"))

    @property
    def names(self) -> frozenset:
        return frozenset(self.bound)

    def moved(self, inputs: dict) -> frozenset:
        """The bound names given another tensor than the one bound."""
        return frozenset(name for name, tensor in self.bound.items() if inputs[name] is not tensor)

    def newly_lent(self, inputs: dict, lent_buffers: LentBuffers, reader) -> bool:
        """Whether an open name comes lent by another graph (the parameters the update lends
        from its capture on): a capture from these inputs binds it."""
        return any(lent_buffers.lender(inputs[name]) not in (None, reader) for name in self.open)

    def barring(self, names: frozenset) -> "Binding":
        return Binding(self.bound, self.open, self.barred | names)


def _bindable(lowered, split: HostSplit) -> frozenset:
    """The inputs a captured graph may read where another graph lent them: none placed in its
    arena (a placed input needs memory of its own), written by a launch, returned as an output,
    or read by a host launch after the replay (a pending sum reads it when its digits are formed,
    by which time its lender may have written over it)."""
    written = {key for launch in lowered.launches for key in launch.writes}
    held = {key for launch in split.after for key in launch.reads}
    excluded = set(placements(lowered)) | written | held | set(lowered.outputs.values())
    return frozenset(name for name, key in lowered.inputs.items() if key not in excluded)


def _fits(tensor, buffer, device) -> bool:
    """Whether the kernels may read `tensor` as `buffer`'s slot: its shape and dtype, laid out
    contiguously (a slot is read through views of its contiguous layout, launches.strided), on
    the graph's device."""
    return (tuple(tensor.shape) == tuple(buffer.shape) and tensor.dtype == torch_dtype(buffer.dtype)
            and tensor.stride() == contiguous_strides(buffer.shape) and tensor.device == device)


def _run_launches(launches, env: dict) -> None:
    for launch in launches:
        launch(env)


def _is_buffer(lowered, key: str) -> bool:
    """Whether an output is a tensor buffer (an exact graph's accumulators are host objects)."""
    return lowered.buffers[key].kind != "accumulator"


@contextlib.contextmanager
def waits_refused(torch):
    """PyTorch's synchronisation debug mode set to raise while device launches warm up."""
    was = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(was)


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
        if key in placed and output in placed and placed[key][1] == placed[output][1] \
                and lowered.in_place.get(placed[output][0]) != placed[key][0]:  # there already
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
    """The outputs whose memory meets no input's slot, or only the slot of the input of their
    own name, being that very memory (an update made in place). Lent, an output may come back
    as any input of the next call; the copies in must not write over memory they read from,
    which `InPlace.detached` sees to for the outputs lying in slots."""
    slots = {name: byte_span(env[key]) for name, key in lowered.inputs.items()}

    def lendable(name: str, key: str) -> bool:
        met = [other for other, slot in slots.items() if spans_meet(byte_span(env[key]), slot)]
        return not met or (met == [name] and same_memory(env[key], env[lowered.inputs[name]]))

    return frozenset(name for name, key in lowered.outputs.items() if _is_buffer(lowered, key) and lendable(name, key))


@dataclass(frozen=True)
class InPlace:
    """The inputs whose slots the replay updates in place: the outputs of their names lie in
    those very slots. `spans`: the bytes of those slots, merged into runs (a few flat buffers)."""

    names: frozenset
    spans: tuple

    @classmethod
    def of(cls, lowered, env: dict) -> "InPlace":
        names = frozenset(name for name, key in lowered.inputs.items() if name in lowered.outputs
                          and _is_buffer(lowered, lowered.outputs[name])
                          and same_memory(env[key], env[lowered.outputs[name]]))
        return cls(names, _merged([byte_span(env[lowered.inputs[name]]) for name in names]))

    def settled(self, inputs: dict, env: dict, outputs: dict) -> frozenset:
        """The names whose input is the very output of that name the last replay lent: the
        replay left it in its slot, so there is nothing to copy."""
        return frozenset(name for name in self.names if inputs[name] is env[outputs[name]])

    def detached(self, inputs: dict, settled: frozenset) -> dict:
        """`inputs`, each other tensor lying in an updated slot cloned: the copies into the
        slots would write over it (parameters given back under each other's names)."""
        if not self.spans:
            return inputs
        return {name: value.clone() if name not in settled and self.meets(value) else value
                for name, value in inputs.items()}

    def meets(self, tensor) -> bool:
        span = byte_span(tensor)
        return any(spans_meet(span, run) for run in self.spans)


def _merged(spans: list) -> tuple:
    """Byte spans joined where they touch or overlap, in order."""
    runs: list = []
    for start, stop in sorted(spans):
        if runs and start <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(runs[-1][1], stop))
        else:
            runs.append((start, stop))
    return tuple(runs)


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
