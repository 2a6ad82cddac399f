"""Whether a run's memory plan fits this machine, decided before anything large is allocated.

A run whose plan cannot fit stops before its first step with E-MEM-002, which names the
run's largest tensors and the knob that shrinks them (`:batch`, or a parameter's size); a
plan that fits may still meet an allocation that fails (the plan leaves out a kernel's
scratch and Python's own memory), which stops the run with E-MEM-003.

What a run needs:
- on the host (the CPU interpreter), one graph's values at a time: the memory plan's peak
  (plan/memory.py, its inputs included) of the graph that needs most, plus what the run keeps
  between calls and that graph does not read (the parameters, the optimizer state, and a
  step's running gradient sum when it has several microbatches);
- on a device (CUDA), every graph's arena for the whole run, with each graph's inputs and
  outputs and the running gradient sum (`held_on_device`, which the CUDA probe's
  training_peak_bytes also counts).

The room it has:
- on the host, the least of the memory available (MemAvailable in /proc/meminfo), what the
  cgroup's limit leaves (memory.max less memory.current; cgroup v1's limit_in_bytes less
  usage_in_bytes) and what the address-space limit (ulimit -v) leaves beyond the process's
  size; SEXPGPU_HOST_MEMORY, which run/setup.py passes, replaces them. A run plans at most
  HOST_SHARE of it;
- on a device, the free memory its probe reports (plan/device.py), all of it: the arenas are
  what the backend allocates.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from math import prod
from pathlib import Path

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.core.ir import described, typed
from sexpgpu.plan.memory import gib_text, plan_memory

HOST_SHARE = 0.9  # of the host's room, what a run's plan may take: the rest is scratch, Python and the data
DEVICE_SHARE = 1.0
LARGEST = 3  # tensors an E-MEM-002 names
NO_LIMIT = 2**60  # a cgroup "limit" this large is the kernel's way of saying none


@dataclass(frozen=True)
class Room:
    bytes: int
    where: str  # what the figure is, as a message says it: "the host memory available (MemAvailable)"


@dataclass(frozen=True)
class Knob:
    kind: str  # a key of HINTS
    text: str  # what the tensor scales with, for the message


@dataclass(frozen=True)
class Tensor:
    label: str  # "matmul in fc1 at f.sexp:6:17 (f32[2147483647 64], 512.0 GiB)"
    nbytes: int
    knob: Knob


HINTS = {
    "batch": "Use a smaller :batch (more :microbatches keep the records of a step), or run where more memory is free.",
    "parameter": "Make that parameter smaller in the file (the size of its layer), or run where more memory is free.",
    "graph": "Make the values the file computes smaller, or run where more memory is free.",
}


# --- what a run needs ---------------------------------------------------------------------------

def host_need(graphs, held: dict) -> int:
    """Bytes the CPU interpreter holds at its fullest: the peak of the graph that needs most,
    plus what the run keeps between calls (`held`: graph input name -> bytes) that it does not read."""
    return max((plan_memory(graph).peak_bytes + sum(size for name, size in held.items() if name not in graph.inputs)
                for graph in graphs), default=0)


def held_on_device(graphs, arena, running: int = 0) -> int:
    """Bytes a device backend that keeps every graph's arena for the run holds: each graph's
    arena (`arena(graph)`), inputs and outputs, and `running` (the running gradient sum)."""
    return running + sum(arena(graph) + _bytes(graph.inputs) + _bytes(graph.outputs) for graph in graphs)


def running_gradients(micro) -> int:
    """Bytes of a step's running gradient sum: one set of the microbatch graph's gradients."""
    return sum(node.nbytes for name, node in micro.outputs.items() if name.startswith("grad/"))


def _bytes(nodes: dict) -> int:
    return sum(node.nbytes for node in nodes.values())


# --- the room it has ------------------------------------------------------------------------------

def host_room(given: int | None = None, proc: Path | str = "/proc", cgroup: Path | str = "/sys/fs/cgroup",
              address_limit: int | None | str = "process") -> Room:
    """The host memory this process may still take: the least the machine's limits leave,
    or `given` (SEXPGPU_HOST_MEMORY). `address_limit` is RLIMIT_AS ("process": this process's own)."""
    if given is not None:
        return Room(given, "the host memory SEXPGPU_HOST_MEMORY sets")
    proc, cgroup = Path(proc), Path(cgroup)
    if address_limit == "process":
        address_limit = _address_limit()
    rooms = [room for room in (_available(proc), _cgroup_room(cgroup), _address_room(proc, address_limit))
             if room is not None]
    return min(rooms, key=lambda room: room.bytes) if rooms else Room(NO_LIMIT, "the host memory (not measured here)")


def _available(proc: Path) -> Room | None:
    found = _kib_field(proc / "meminfo", "MemAvailable:")
    if found is not None:
        return Room(found, "the host memory available (MemAvailable)")
    try:  # no /proc: what the operating system reports as free pages
        return Room(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the host memory free")
    except (ValueError, OSError, AttributeError):
        return None


# cgroup v2's files, then v1's: (limit, usage), under the cgroup file system
CGROUP_FILES = (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"))


def _cgroup_room(cgroup: Path) -> Room | None:
    for limit_file, usage_file in CGROUP_FILES:
        limit = _number(cgroup / limit_file)
        if limit is None:
            continue
        usage = _number(cgroup / usage_file) or 0
        if limit >= NO_LIMIT:
            return None
        return Room(max(0, limit - usage), f"the memory left under this cgroup's limit ({limit_file})")
    return None


def _address_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def _address_room(proc: Path, limit: int | None) -> Room | None:
    if limit is None:
        return None
    size = _kib_field(proc / "self" / "status", "VmSize:") or 0
    return Room(max(0, limit - size), "the address space left under this process's limit (ulimit -v)")


def _kib_field(path: Path, label: str) -> int | None:
    """Bytes of a `Label:   1234 kB` line of a /proc file."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(label):
            parts = line[len(label):].split()
            return int(parts[0]) * 1024 if parts and parts[0].isdigit() else None
    return None


def _number(path: Path) -> int | None:
    """A cgroup file's number; "max" (no limit) is NO_LIMIT; None when it is not there."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return NO_LIMIT
    return int(text) if text.isdigit() else None


# --- the decision ---------------------------------------------------------------------------------

def check_fits(need: int, room: Room, largest, share: float) -> None:
    """E-MEM-002 when `need` bytes exceed `share` of the room."""
    if need <= share * room.bytes:
        return
    of = f", of which a run plans at most {share:.0%}" if share < 1 else ""
    message = f"the run's memory plan needs {gib_text(need)}, and {room.where} is {gib_text(room.bytes)}{of}."
    if largest:
        message += " Its largest tensors: " + "; ".join(tensor.label for tensor in largest) + "."
        knobs = list(dict.fromkeys(tensor.knob.text for tensor in largest))
        message += f" They scale with {' and '.join(knobs)}."
    hint = HINTS[largest[0].knob.kind] if largest else HINTS["graph"]
    raise SexpgpuError("E-MEM-002", message, hint=hint)


def largest_tensors(graphs, batch: int, params: dict, count: int = LARGEST) -> tuple:
    """The `count` largest values of `graphs`, each once (a parameter read by several graphs
    is one), largest first, with what shrinks it. Only those are described."""
    nodes = []
    for graph in graphs:
        names = {node: name for name, node in graph.inputs.items()}
        nodes += [(node, names.get(node)) for node in graph.nodes]
    found: dict = {}
    for node, input_name in sorted(nodes, key=lambda pair: -pair[0].nbytes):
        if len(found) == count:
            break
        tensor = _tensor(node, input_name, batch, params)
        found.setdefault(tensor.label, tensor)
    return tuple(found.values())


def _tensor(node, input_name: str | None, batch: int, params: dict) -> Tensor:
    label = f"{described(node, input_name)} ({typed(node)}, {gib_text(node.nbytes)})"
    return Tensor(label, node.nbytes, _knob(node, input_name, batch, params))


def _knob(node, input_name: str | None, batch: int, params: dict) -> Knob:
    """What the tensor's size scales with: a parameter it holds the values of (itself, its
    gradient or optimizer state), the batch on its first axis, a parameter's size, all the
    parameters' (the update's flat vectors), or else the shapes of the graph."""
    path = _parameter_of(input_name, params)
    if path is None and node.shape[:1] == (batch,):
        return Knob("batch", f":batch ({batch})")
    sizes = {path: prod(spec.shape) for path, spec in params.items()}
    path = path or next((path for path, size in sizes.items() if size == node.size), None)
    if path is not None:
        return Knob("parameter", f"the size of the parameter {_declared(path, params[path])}")
    if sizes and node.size == sum(sizes.values()):
        largest = max(sizes, key=lambda path: (sizes[path], path))
        return Knob("parameter", f"the parameters' sizes (the largest: {_declared(largest, params[largest])})")
    where = f" at {node.loc}" if node.loc is not None else ""
    return Knob("graph", f"the shapes the graph gives {node.op}{where}")


def _declared(path: str, spec) -> str:
    dims = " ".join(str(dim) for dim in spec.shape)
    return f"{path} ({spec.dtype}[{dims}]" + (f", declared at {spec.loc})" if spec.loc is not None else ")")


def _parameter_of(input_name: str | None, params: dict) -> str | None:
    """The parameter whose values (or gradient, or optimizer state) a graph input holds."""
    if input_name is None:
        return None
    for prefix in ("param/", "grad/"):
        if input_name.startswith(prefix) and input_name[len(prefix):] in params:
            return input_name[len(prefix):]
    if input_name.startswith("state/"):  # state/<slot>/<path>
        path = input_name.split("/", 2)[-1]
        return path if path in params else None
    return None
