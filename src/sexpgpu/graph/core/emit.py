"""The emitter: makes IR nodes through the op table and records them in creation order.

`e("add", a, b)` checks the op's rule, canonicalises its attributes and appends the node.
Both the syntax builder (build.py) and the gradient rules (ops.py, autodiff.py) make nodes
this way, so every node in every graph has passed its op's rule. The creation order is the
order of the finished graph (ir.make_graph), so it is part of the contract: the same calls
in the same order give the same graph.
"""

from __future__ import annotations

from contextlib import contextmanager

import math

from sexpgpu.errors import SexpgpuError
from sexpgpu.graph.core.ir import Attrs, Node, make_graph
from sexpgpu.graph.core.ops import OPS, dims_text

# The graph's own limits (docs/language.md, "Limits"; the language's are lang/limits.py)
ELEMENTS_MAX = 2**40  # elements of any one tensor (a 4 TiB float32 tensor: past every device)
NODES_MAX = 2**17  # nodes of one graph (forward, gradients and update included)
I32_MIN, I32_MAX = -(2**31), 2**31 - 1  # the values of an i32


def _is_integer(value) -> bool:
    return isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())


class Emitter:
    def __init__(self):
        self.nodes: list = []
        self.scope = ""  # the `name` of nodes made now: the scope being built
        self.loc = None  # the `loc` of nodes made now: the syntax being built
        self._made: dict = {}  # Emitter.once's nodes by key

    def __call__(self, op: str, *inputs: Node, **attrs) -> Node:
        definition = OPS[op]
        if definition.arity is not None and len(inputs) != definition.arity:
            raise AssertionError(f"{op} takes {definition.arity} inputs, got {len(inputs)}")
        dtype, shape, canonical = definition.infer(inputs, attrs)
        node = Node(op, dtype, tuple(shape), tuple(inputs), Attrs(canonical), self.scope, self.loc)
        self._check_size(node)
        self.nodes.append(node)
        return node

    def _check_size(self, node: Node) -> None:
        """The limits of docs/language.md: what a run can hold, and what checking can build."""
        if node.size > ELEMENTS_MAX:
            raise SexpgpuError("E-FORM-011", f"a tensor of shape {dims_text(node.shape)} has {node.size:,} elements: "
                                             "at most 2^40 are allowed in one tensor.", self.loc)
        if len(self.nodes) >= NODES_MAX:
            raise SexpgpuError("E-GRAPH-007", f"the graph has more than {NODES_MAX:,} nodes (gradients and update "
                                              "included): the file describes too large a graph.", self.loc)

    @contextmanager
    def at(self, scope: str | None = None, loc=None):
        """Make the nodes of the `with` body under `scope` and `loc` (None: keep the current)."""
        saved = self.scope, self.loc
        if scope is not None:
            self.scope = scope
        if loc is not None:
            self.loc = loc
        try:
            yield
        finally:
            self.scope, self.loc = saved

    def rewrite(self, nodes, rule) -> dict:
        """Make `nodes` (in graph order) again here: {id(node): its new value}. Each is
        `rule(self, node, inputs)` on its inputs' new values; where that gives None, the node
        itself when its inputs are unchanged (so inputs and constants stay the same objects),
        else its op on the new inputs. Each is made under its own scope and location."""
        mapped: dict = {}
        saved = self.scope, self.loc
        try:
            for node in nodes:
                self.scope, self.loc = node.name, node.loc
                inputs = tuple(mapped[id(source)] for source in node.inputs)
                made = rule(self, node, inputs)
                if made is None and all(new is old for new, old in zip(inputs, node.inputs)):
                    self.nodes.append(node)
                    made = node
                mapped[id(node)] = made if made is not None else self(node.op, *inputs, **node.attrs)
        finally:
            self.scope, self.loc = saved
        return mapped

    def input(self, name: str, dtype: str, shape) -> Node:
        return self("input", name=name, dtype=dtype, shape=tuple(shape))

    def const(self, value, like: Node | None = None, dtype: str | None = None, shape=()) -> Node:
        """A constant filled with `value`, of `like`'s dtype unless `dtype` is given.

        Constants are shared: the same value, dtype and shape give the same node.
        """
        dtype = dtype or (like.dtype if like is not None else "f32")
        if dtype == "bool":
            value = bool(value)
        elif dtype == "i32" and _is_integer(value):
            if not I32_MIN <= value <= I32_MAX:
                raise SexpgpuError("E-FORM-011", "an int32 constant must be from -2^31 to 2^31-1, found "
                                                 f"{value if abs(value) < 1e30 else 'a larger number'}.", self.loc)
            value = int(value)
        else:
            value = float(value)
        return self.once(("const", repr(value), dtype, tuple(shape)),
                         lambda: self("const", value=value, dtype=dtype, shape=tuple(shape)))

    def once(self, key, make) -> Node:
        """The node `make()` gives, made once for `key` by this emitter: shared constants, and
        the parts a decomposition shares between ops (ops.py's attention)."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def minus_one(self, node: Node) -> Node:
        if node.op == "const":
            return self.const(node.attrs["value"] - 1, like=node, shape=node.shape)
        return self("sub", node, self.const(1, like=node))

    def unbroadcast(self, g: Node, shape) -> Node:
        """Sum `g` over the axes that broadcasting stretched, giving `shape`."""
        shape = tuple(shape)
        if g.shape == shape:
            return g
        lead = g.rank - len(shape)
        stretched = [lead + axis for axis, dim in enumerate(shape) if dim == 1 and g.shape[lead + axis] != 1]
        axes = tuple(range(lead)) + tuple(stretched)
        total = self("sum", g, axes=axes, keep=False) if axes else g
        return total if total.shape == shape else self("reshape", total, shape=shape)

    def expand(self, g: Node, reduced: Node, shape) -> Node:
        """Broadcast `g`, shaped like the result of the reduction `reduced`, back to `shape`."""
        axes = reduced.attrs["axes"]
        kept = tuple(1 if axis in axes else dim for axis, dim in enumerate(shape))
        if g.shape != kept:
            g = self("reshape", g, shape=kept)
        return g if g.shape == tuple(shape) else self("broadcast", g, shape=tuple(shape))

    def graph(self, inputs: dict, outputs: dict):
        return make_graph(inputs, outputs, self.nodes)
