"""The graph IR: typed, shaped dataflow nodes and the graphs that hold them.

A `Node` is one operation: its op name (a key of `sexpgpu.graph.ops.OPS`), the dtype and
shape of its result, its input nodes, and static attributes. Nodes compare by identity, so
a dict keyed by nodes keeps insertion order and no order here ever depends on hashing.

A `Graph` names its inputs and outputs and lists every node exactly once in a fixed
topological order: inputs first, in the order of `Graph.inputs`, then every other node in
the order it was created. Backends execute nodes in that order; autodiff walks it backwards.

Dtypes: `f32`; `bf16` (a bfloat16 value: backends store it however they like, but every
node of dtype bf16 holds its result rounded to nearest even into bfloat16); `i32`; and
`bool` for masks and comparisons.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sexpgpu.errors import Location

DTYPES = ("f32", "bf16", "i32", "bool")
FLOAT_DTYPES = ("f32", "bf16")
ITEM_BYTES = {"f32": 4, "bf16": 2, "i32": 4, "bool": 1, "acc": 4}  # acc (ops.py): planned as its f32

_DTYPE_SPELLINGS = {
    "f32": "f32", "float32": "f32", "F32": "f32",
    "bf16": "bf16", "bfloat16": "bf16", "BF16": "bf16",
    "i32": "i32", "int32": "i32", "I32": "i32",
    "bool": "bool", "BOOL": "bool",
}


def dtype_named(name: str) -> str:
    """The IR dtype for a spelling a data file or numpy may use (`float32`, `F32`, `f32`)."""
    try:
        return _DTYPE_SPELLINGS[str(name)]
    except KeyError:
        raise ValueError(f"unsupported dtype '{name}': expected one of {', '.join(DTYPES)}") from None


class Attrs(Mapping):
    """A frozen, hashable mapping of an op's static attributes (ints, floats, strings, tuples)."""

    __slots__ = ("_items", "_dict")

    def __init__(self, items=()):
        pairs = tuple(sorted(dict(items).items()))
        for key, value in pairs:
            hash(value)  # attributes must be immutable; a list here is a bug in the caller
        self._items = pairs
        self._dict = dict(pairs)

    def __getitem__(self, key):
        return self._dict[key]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{key}={value!r}" for key, value in self._items) + "}"


EMPTY_ATTRS = Attrs()


@dataclass(frozen=True, eq=False)
class Node:
    """One operation and its result. `name` is the scope it was built in (e.g. `block0/attn`)."""

    op: str
    dtype: str
    shape: tuple[int, ...]
    inputs: tuple["Node", ...] = ()
    attrs: Attrs = EMPTY_ATTRS
    name: str = ""
    loc: Location | None = field(default=None, repr=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return self.size * ITEM_BYTES[self.dtype]

    def __repr__(self) -> str:
        dims = "x".join(str(dim) for dim in self.shape) or "scalar"
        return f"<{self.op} {self.dtype}[{dims}] {self.name!r}>"


@dataclass(frozen=True, eq=False)
class Graph:
    """Named inputs and outputs and every node in a fixed topological order.

    Graphs compare and hash by identity, so a backend may key its compiled form by graph."""

    inputs: dict  # name -> Node (op "input"), in the documented order of the graph's maker
    outputs: dict  # name -> Node, in the documented order of the graph's maker
    nodes: tuple  # every node once; inputs first, then creation order

    def positions(self) -> dict:
        """node -> its index in `nodes`."""
        return {node: index for index, node in enumerate(self.nodes)}

    def consumers(self) -> dict:
        """node -> the nodes reading it, in graph order (a node reading twice appears twice)."""
        users = {node: [] for node in self.nodes}
        for node in self.nodes:
            for source in node.inputs:
                users[source].append(node)
        return users

    def op_counts(self) -> dict:
        """op -> how many nodes use it, sorted by op name."""
        counts: dict = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return dict(sorted(counts.items()))

    def dump(self) -> str:
        """A readable listing, one node per line: `%index = op(inputs) attrs : dtype[shape]`."""
        where = self.positions()
        lines = []
        names = {node: name for name, node in self.inputs.items()}
        for index, node in enumerate(self.nodes):
            args = ", ".join(f"%{where[source]}" for source in node.inputs)
            attrs = f" {node.attrs!r}" if node.attrs else ""
            label = f"  ; {names[node]}" if node in names else (f"  ; {node.name}" if node.name else "")
            dims = "x".join(str(dim) for dim in node.shape) or "scalar"
            lines.append(f"%{index} = {node.op}({args}){attrs} : {node.dtype}[{dims}]{label}")
        for name, node in self.outputs.items():
            lines.append(f"output {name} = %{where[node]}")
        return "\n".join(lines)


# the graph inputs a training graph names: their prefix -> how a message names one
INPUT_NAMES = {
    "field/": "the record field ",
    "param/": "the parameter ",
    "grad/": "the gradient of ",
    "state/": "the optimizer state ",
}


def described(node: Node, input_name: str | None = None) -> str:
    """A value as messages name it: a graph input by its name ('the parameter fc1/w'), any
    other node by its op, scope and place in the file ('matmul in fc1 at f.sexp:6:17')."""
    if input_name is not None:
        return input_described(input_name)
    text = f"{node.op} in {node.name}" if node.name else node.op
    return text + (f" at {node.loc}" if node.loc is not None else "")


def input_described(name: str) -> str:
    """A graph input (or a checkpoint's tensor) by its name: 'the parameter fc1/w'."""
    prefix = next((prefix for prefix in INPUT_NAMES if name.startswith(prefix)), None)
    return INPUT_NAMES[prefix] + name[len(prefix):] if prefix else f"the input {name}"


def typed(node: Node) -> str:
    """Its dtype and shape: 'f32[64 128]'."""
    return f"{node.dtype}[{' '.join(str(dim) for dim in node.shape)}]"


def make_graph(inputs: dict, outputs: dict, created: list) -> Graph:
    """A graph of the nodes in `created` (creation order) that the outputs need.

    Every input stays, used or not, so that a graph's inputs are a fixed function of its
    maker and not of what the body happens to read.
    """
    needed = set()
    stack = list(outputs.values())
    while stack:
        node = stack.pop()
        if id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(node.inputs)
    input_nodes = list(inputs.values())
    input_ids = {id(node) for node in input_nodes}
    body = [node for node in created if id(node) in needed and id(node) not in input_ids]
    nodes = tuple(input_nodes + body)
    _check_topological(nodes, outputs)
    return Graph(dict(inputs), dict(outputs), nodes)


def _check_topological(nodes: tuple, outputs: dict) -> None:
    seen = set()
    for node in nodes:
        for source in node.inputs:
            if id(source) not in seen:
                raise AssertionError(f"{node!r} reads {source!r} before it is computed")
        seen.add(id(node))
    for name, node in outputs.items():
        if id(node) not in seen:
            raise AssertionError(f"output {name} is not a node of the graph")
