"""cuDNN's native pattern graphs, for the CUDA backend's lowering and probe: which groups of
a graph's nodes one cuDNN graph may compute in their place (the table `PATTERNS`), and which
patterns a run has on (`decide_patterns`: SEXPGPU_PATTERNS and what the device supports).

A pattern changes bits by design: cuDNN sums and rounds inside its graph where the
interpreter rounds between nodes (a bf16 product's result is not rounded to bf16 before its
bias is added, say). So the patterns on are part of a run's configuration (SEXPGPU_PATTERNS,
checked on resume) and of its recorded device (`DeviceFacts.patterns`: another machine that
runs other patterns lowers otherwise).

    PATTERNS                                  name -> how its groups are found in a graph
    match_patterns(graph, ("attention",))     {first node: Match}, the groups a lowering may take
    decide_patterns(setting, support)         PatternsInEffect: the patterns on, and why the rest are off

What a match needs to hold, so that one launch can replace its nodes: every node of the group
but its results is read by nothing outside the group and is no output of the graph; every
operand precedes the node where the launch is emitted (`emit`), and every reader outside the
group of a result follows it. The matchers check it from the graph alone, so a match is a
function of the graph. Whether cuDNN then builds a plan for it is the device's answer (the
backend lowers the group's nodes as usual where it does not, and says so: `PatternUse`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from sexpgpu.backends.cuda.convolutions import convolution_key

ACTIVATIONS = ("relu", "gelu")  # cuDNN's pointwise modes of these names compute the ops' formulas (gelu with erf)
BACKWARD_OPS = ("attention_grad_q", "attention_grad_kv")
OFF_BY_SETTING = "SEXPGPU_PATTERNS=off"
REASON_CHARS = 160  # a decline's reason in the report line is cut here (the GPU tests print it whole)


@dataclass(frozen=True)
class AttentionKey:
    """One fused attention graph: q (batch, heads, queries, width), k (batch, heads, keys,
    width), v (batch, heads, keys, value_width); the leading axes of the op's operands
    before the heads are folded into `batch`."""

    role: str  # "Forward" or "Backward"
    batch: int
    heads: int
    queries: int
    keys: int
    width: int
    value_width: int
    causal: bool
    scale: float
    dtype: str
    stats: bool = True  # the forward also writes each query's log-sum-exp, which a backward reads

    @property
    def q_dims(self) -> tuple:
        return (self.batch, self.heads, self.queries, self.width)

    @property
    def k_dims(self) -> tuple:
        return (self.batch, self.heads, self.keys, self.width)

    @property
    def v_dims(self) -> tuple:
        return (self.batch, self.heads, self.keys, self.value_width)

    @property
    def o_dims(self) -> tuple:
        return (self.batch, self.heads, self.queries, self.value_width)

    @property
    def stats_dims(self) -> tuple:
        return (self.batch, self.heads, self.queries, 1)

    def key(self) -> str:
        causal = ", causal" if self.causal else ""
        stats = "" if self.role == "Backward" or self.stats else ", no statistics"
        return (f"{self.role} Attention {{ batch: {self.batch}, heads: {self.heads}, queries: {self.queries}, "
                f"keys: {self.keys}, width: {self.width}, value width: {self.value_width}, scale: {self.scale:.6g}"
                f"{causal}{stats} }} {self.dtype}")


@dataclass(frozen=True)
class MatrixProduct:
    """A product of a (rows, inner) matrix and an (inner, columns) one: the left operand's
    leading axes folded into its rows."""

    rows: int
    inner: int
    columns: int
    dtype: str

    def key(self) -> str:
        return f"Product {{ rows: {self.rows}, inner: {self.inner}, columns: {self.columns} }} {self.dtype}"


@dataclass(frozen=True)
class EpilogueKey:
    """A product (a MatrixProduct, or a Forward ConvolutionKey) with its bias added, then its
    activation when it has one, in float32, as one cuDNN graph."""

    product: object
    activation: str | None  # one of ACTIVATIONS, or None: the bias alone
    keeps_sum: bool  # the biased sum is written too (the activation's gradient reads it)

    @property
    def dtype(self) -> str:
        return self.product.dtype

    def key(self) -> str:
        activation = f" + {self.activation}" if self.activation else ""
        return f"{self.product.key()} + bias{activation}" + (", keeping the sum" if self.keeps_sum else "")


@dataclass(frozen=True)
class Match:
    """A group of nodes one cuDNN graph computes."""

    pattern: str  # a name of PATTERNS
    key: object  # AttentionKey or EpilogueKey; `.key()` is its text
    nodes: tuple  # every node the graph computes, in the graph's order; the first is where it is decided
    operands: tuple  # the nodes it reads, in the order its builder takes them
    results: tuple  # the nodes whose values it writes; the others are read by no node outside the group
    emit: object  # the node at which its launch runs: every operand precedes it, every outside reader follows


@dataclass(frozen=True)
class PatternUse:
    """What a lowering did with one match."""

    pattern: str
    key: str  # the match's key text
    taken: bool  # cuDNN's graph computes it; else the ordinary lowering ran its nodes
    why: str = ""  # why cuDNN declined it


@dataclass(frozen=True)
class Pattern:
    name: str  # as the device line and the report name it
    title: str  # as the report's patterns line names it
    match: Callable  # match(graph, consumers, order) -> [Match]


# --- attention ------------------------------------------------------------------------------

def _attention_key(role: str, q, k, v, attrs, stats: bool = True) -> AttentionKey:
    lead = tuple(q.shape[:-2])
    heads = int(lead[-1]) if lead else 1
    batch = 1
    for size in lead[:-1]:
        batch *= int(size)
    return AttentionKey(role, batch, heads, int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1]),
                        int(v.shape[-1]), bool(attrs["causal"]), float(attrs["scale"]), q.dtype, stats)


def _backward_of(node, forward) -> bool:
    """Whether a cotangent op reads `forward` as its output, with the forward's operands."""
    return node.op in BACKWARD_OPS and node.inputs[3] is forward and node.inputs[:3] == forward.inputs \
        and node.attrs == forward.attrs


def _attention_matches(graph, consumers, order) -> list:
    """bf16 attention: each forward op, and each pair of cotangent ops of one output and
    cotangent (one cuDNN backward graph writes dq, dk and dv). Float32 attention is the
    backend's own fused kernels (docs/cuda.md, "Attention"): cuDNN's fused attention has no
    float32 graph."""
    matches, backward = [], {}
    for node in graph.nodes:
        if node.dtype != "bf16":
            continue
        if node.op == "attention_core":
            stats = any(_backward_of(reader, node) for reader in consumers[node])
            matches.append(Match("attention", _attention_key("Forward", *node.inputs, node.attrs, stats), (node,),
                                 node.inputs, (node,), node))
        elif node.op in BACKWARD_OPS:
            backward.setdefault((node.inputs, node.attrs), []).append(node)
    for (operands, attrs), nodes in backward.items():
        if len({node.op for node in nodes}) == len(nodes):  # one of each op at most
            key = _attention_key("Backward", *operands[:3], attrs)
            matches.append(Match("attention", key, tuple(nodes), operands, tuple(nodes), nodes[0]))
    return matches


# --- products and convolutions with their epilogues ------------------------------------------

@dataclass(frozen=True)
class ProductRule:
    """Which product an epilogue pattern starts from, its key, and the bias it adds."""

    op: str
    dtypes: tuple
    key: Callable  # key(node) -> MatrixProduct or ConvolutionKey, or None when the node is not one
    bias_shape: Callable  # bias_shape(product node) -> the bias shapes it takes (broadcast along the rest)


def _matrix_product(node):
    a, b = node.inputs
    if b.rank != 2 or a.rank < 2:
        return None
    rows = 1
    for size in a.shape[:-1]:
        rows *= int(size)
    return MatrixProduct(rows, int(a.shape[-1]), int(b.shape[-1]), node.dtype)


# bf16 products only: a float32 product's implementation is a measured choice (plan/choices.py)
PRODUCTS = ProductRule("matmul", ("bf16",), _matrix_product, lambda node: ((node.shape[-1],),))
CONVOLUTIONS = ProductRule("conv2d", ("f32", "bf16"), convolution_key,
                           lambda node: ((node.shape[1], 1, 1), (1, node.shape[1], 1, 1)))


def _only_reader(node, consumers, outputs):
    """The one node reading `node`, or None when it has other readers or is a graph output."""
    readers = consumers[node]
    return readers[0] if len(readers) == 1 and node not in outputs else None


def _bias_sum(summed, consumers, outputs, rule: ProductRule, product):
    """(the add of the bias, the bias) when `summed`'s one reader adds a float32 bias to it."""
    add = _only_reader(summed, consumers, outputs)
    if add is None or add.op != "add" or add.shape != summed.shape or len(set(add.inputs)) != 2:
        return None
    bias = add.inputs[1] if add.inputs[0] is summed else add.inputs[0]
    if bias.dtype != "f32" or tuple(bias.shape) not in [tuple(shape) for shape in rule.bias_shape(product)]:
        return None
    return add, bias


def _activation(summed, consumers, order):
    """The first activation reading the biased sum, when every other reader follows it."""
    found = next((reader for reader in consumers[summed] if reader.op in ACTIVATIONS), None)
    if found is None or any(order[reader] < order[found] for reader in consumers[summed] if reader is not found):
        return None
    return found


def _epilogue_matches(name: str, rule: ProductRule, graph, consumers, order) -> list:
    """product -> (a cast to float32, for a bf16 product) -> add a bias -> (an activation):
    the sum of products and the bias in float32, in one cuDNN graph."""
    outputs = set(graph.outputs.values())
    found = (_epilogue(name, rule, node, consumers, outputs, order) for node in graph.nodes
             if node.op == rule.op and node.dtype in rule.dtypes and rule.key(node) is not None)
    return [match for match in found if match is not None]


def _epilogue(name: str, rule: ProductRule, product, consumers, outputs, order):
    nodes, summed = [product], product
    if product.dtype != "f32":
        summed = _only_reader(product, consumers, outputs)
        if summed is None or summed.op != "cast" or summed.dtype != "f32":
            return None
        nodes.append(summed)
    found = _bias_sum(summed, consumers, outputs, rule, product)
    if found is None:
        return None
    add, bias = found
    active = _activation(add, consumers, order)
    keeps_sum = active is not None and (len(consumers[add]) > 1 or add in outputs)
    results = (add,) if active is None else ((add, active) if keeps_sum else (active,))
    key = EpilogueKey(rule.key(product), active.op if active is not None else None, keeps_sum)
    nodes += [add] + ([active] if active is not None else [])
    return Match(name, key, tuple(nodes), tuple(product.inputs) + (bias,), results, nodes[-1])


PATTERNS = (
    Pattern("attention", "fused attention", _attention_matches),
    Pattern("products", "products with their epilogues", partial(_epilogue_matches, "products", PRODUCTS)),
    Pattern("convolutions", "convolutions with their epilogues",
            partial(_epilogue_matches, "convolutions", CONVOLUTIONS)),
)
PATTERN_NAMES = tuple(pattern.name for pattern in PATTERNS)


def match_patterns(graph, names) -> dict:
    """{first node: Match} of the patterns `names` in `graph` (their groups never overlap)."""
    if not names:
        return {}
    consumers = graph.consumers()
    order = {node: index for index, node in enumerate(graph.nodes)}
    found = {}
    for pattern in PATTERNS:
        if pattern.name in names:
            found.update((match.nodes[0], match) for match in pattern.match(graph, consumers, order))
    return found


# --- which patterns a run has on ------------------------------------------------------------

@dataclass(frozen=True)
class PatternsInEffect:
    """The patterns a run lowers (`on`, in PATTERNS' order) and why each other one is off."""

    on: tuple = ()
    off: tuple = ()  # ((name, why), ...)

    def reason(self, name: str) -> str:
        return dict(self.off).get(name, "")


def decide_patterns(setting: str | None, support: dict) -> PatternsInEffect:
    """SEXPGPU_PATTERNS (`off`, or `on`: the default) and the device's `support` (name ->
    None where cuDNN supports the pattern there, else why not): every supported pattern is
    on unless the setting is off."""
    if setting == "off":
        return PatternsInEffect((), tuple((name, OFF_BY_SETTING) for name in PATTERN_NAMES))
    absent = "this backend has no cuDNN graph for it"
    on = tuple(name for name in PATTERN_NAMES if name in support and support[name] is None)
    off = tuple((name, support.get(name, absent) or absent) for name in PATTERN_NAMES if name not in on)
    return PatternsInEffect(on, off)


def patterns_line(in_effect: PatternsInEffect, uses) -> str:
    """The report's `patterns` line: each pattern on, with how many of its groups cuDNN
    computes (the first one it declined, and why), or off and why."""
    reasons = list(dict.fromkeys(why for _, why in in_effect.off))
    if not in_effect.on and len(reasons) == 1:
        return f"off: {reasons[0]}"
    distinct = list(dict.fromkeys(uses))
    parts = []
    for pattern in PATTERNS:
        if pattern.name in in_effect.on:
            parts.append(f"{pattern.title} on: {_uses_text([use for use in distinct if use.pattern == pattern.name])}")
        else:
            parts.append(f"{pattern.title} off: {in_effect.reason(pattern.name)}")
    return "; ".join(parts)


def _uses_text(uses: list) -> str:
    if not uses:
        return "none in these graphs"
    text = f"{sum(use.taken for use in uses)} of {len(uses)} by cuDNN"
    declined = [use for use in uses if not use.taken]
    if declined:
        why = " ".join(declined[0].why.split())
        why = why if len(why) <= REASON_CHARS else why[:REASON_CHARS] + "..."
        text += f", the rest lowered as without patterns (cuDNN declines {declined[0].key}: {why})"
    return text
