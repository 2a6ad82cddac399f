"""A stand-in for cuDNN's frontend (`import cudnn`, the package nvidia-cudnn-frontend) on the CPU,
for tests of backends/cuda/cudnn_engines.py, cudnn_patterns.py and the lowering's engine and
pattern steps without a GPU.

It has the part of the frontend's graph API that those modules call, with the frontend's
names, keywords and call order (`pygraph`, `tensor`, `conv_fprop` / `conv_dgrad` /
`conv_wgrad`, `matmul`, `add`, `relu`, `gelu`, `sdpa`, `sdpa_backward`, `validate`,
`build_operation_graph`, `deselect_numeric_notes`, `deselect_behavior_notes`,
`create_execution_plans`, `get_execution_plan_count`, `get_engine_and_knobs_at_index`,
`get_behavior_notes_for_plan_at_index`, `build_plan_at_index`,
`get_workspace_size_plan_at_index`, `execute_plan_at_index`), and its plans are a list the
test sets: (engine id, knobs, numerical notes, behaviour notes, builds), the same for every
graph, except that a graph holding a node of a kind in DECLINED has none.

Executing a plan computes the graph's nodes with PyTorch on the CPU in float32 (each result
rounded to its tensor's dtype as it is written, every intermediate kept in float32), and
records which plan ran, with which buffers. It checks what the real one would refuse: a plan
deselected by its notes, or one that does not build, raises when built; a result whose dims
and strides were not named raises at validation; a variant pack that misses an operand, or a
buffer of another shape or strides than declared, raises when executed; an attention
backward not asked for the deterministic algorithm raises when planned.
"""

from __future__ import annotations

import enum
import sys
import math
from dataclasses import dataclass, field


class numerical_note(enum.IntEnum):
    TENSOR_CORE = 0
    DOWN_CONVERT_INPUTS = 1
    REDUCED_PRECISION_REDUCTION = 2
    FFT = 3
    NONDETERMINISTIC = 4
    WINOGRAD = 5
    WINOGRAD_TILE_4x4 = 6
    WINOGRAD_TILE_6x6 = 7
    WINOGRAD_TILE_13x13 = 8


class behavior_note(enum.IntEnum):
    RUNTIME_COMPILATION = 0
    SUPPORTS_CUDA_GRAPH_NATIVE_API = 3


class knob_type(enum.IntEnum):
    SWIZZLE = 1
    TILE_SIZE = 2
    SPLIT_K_BUF = 5
    TILE_CGA_M = 14


class heur_mode(enum.IntEnum):
    A = 0
    B = 1
    FALLBACK = 2


class data_type(enum.IntEnum):
    FLOAT = 0
    BFLOAT16 = 9


class diagonal_alignment(enum.IntEnum):
    TOP_LEFT = 0
    BOTTOM_RIGHT = 1


class cudnnGraphNotSupportedError(RuntimeError):
    pass


@dataclass
class Plan:
    engine: int
    knobs: dict = field(default_factory=dict)
    numerics: tuple = ()
    behaviours: tuple = ()
    builds: bool = True
    workspace: int = 0


__version__ = "0.0-fake"
VERSION = 91900
PLANS = {"A": [], "FALLBACK": []}  # heuristics mode name -> the plans it lists, set by the test
DECLINED: set = set()  # node kinds ("sdpa_backward", "matmul", ...) whose graphs have no plans, set by the test
EXECUTED: list = []  # (engine, the graph's node kinds joined by "+", shapes of the pack's buffers) of each run
ATTENTION_CALLS: list = []  # the keywords of each sdpa and sdpa_backward node made
GRAPHS: list = []  # every pygraph made, in order
HANDLES: list = []


def backend_version() -> int:
    return VERSION


def create_handle():
    HANDLES.append(object())
    return HANDLES[-1]


def set_stream(handle, stream) -> None:
    assert handle in HANDLES


@dataclass(eq=False)
class Tensor:
    name: str
    dim: list
    stride: list
    data_type: object = None
    output: bool = False
    virtual: bool = False  # a node's result not (yet) made an output

    def set_output(self, value):
        self.output, self.virtual = value, not value
        return self

    def set_data_type(self, value):
        self.data_type = value
        return self

    def set_dim(self, dim):
        self.dim = list(dim)
        return self

    def set_stride(self, stride):
        self.stride = list(stride)
        return self


@dataclass
class Node:
    kind: str
    inputs: dict  # name -> Tensor
    params: dict
    results: list


class pygraph:
    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None, handle=None):
        assert handle in HANDLES and compute_data_type == data_type.FLOAT
        assert intermediate_data_type == data_type.FLOAT
        self.io = io_data_type
        self.tensors, self.nodes, self.state = [], [], "building"
        self.numerics, self.behaviours, self.plans, self.built = set(), set(), [], set()
        GRAPHS.append(self)

    def tensor(self, name, dim, stride, data_type):
        self.tensors.append(Tensor(name, list(dim), list(stride), data_type))
        return self.tensors[-1]

    def _node(self, kind, inputs, params, results=1):
        assert self.state == "building"
        for tensor in inputs.values():
            assert tensor is None or tensor in self.tensors, f"{kind}: an input of another graph"
        made = [Tensor(f"{kind}::{index}", [], [], virtual=True) for index in range(results)]
        self.tensors += made
        self.nodes.append(Node(kind, inputs, params, made))
        return made

    def _convolution(self, kind, inputs, padding, stride, dilation, name=""):
        assert dilation == [1, 1] and len(padding) == 2 == len(stride)
        return self._node(kind, inputs, dict(padding=padding, stride=stride))[0]

    def conv_fprop(self, image, weight, padding, stride, dilation, name=""):
        return self._convolution("fprop", dict(image=image, weight=weight), padding, stride, dilation)

    def conv_dgrad(self, loss, filter, padding, stride, dilation, name=""):
        return self._convolution("dgrad", dict(loss=loss, filter=filter), padding, stride, dilation)

    def conv_wgrad(self, image, loss, padding, stride, dilation, name=""):
        return self._convolution("wgrad", dict(image=image, loss=loss), padding, stride, dilation)

    def matmul(self, A, B, compute_data_type=None, padding=0.0, name=""):
        return self._node("matmul", dict(A=A, B=B), {})[0]

    def add(self, a, b, name="", compute_data_type=None):
        return self._node("add", dict(a=a, b=b), {})[0]

    def relu(self, input, name="", compute_data_type=None):
        return self._node("relu", dict(input=input), {})[0]

    def gelu(self, input, name="", compute_data_type=None):
        return self._node("gelu", dict(input=input), {})[0]

    def sdpa(self, q, k, v, generate_stats=None, attn_scale=None, name="", **mask):
        ATTENTION_CALLS.append(dict(mask, kind="sdpa", generate_stats=generate_stats, attn_scale=attn_scale))
        o, stats = self._node("sdpa", dict(q=q, k=k, v=v), dict(mask, scale=attn_scale), results=2)
        return [o, stats if generate_stats else None]

    def sdpa_backward(self, q, k, v, o, dO, stats, attn_scale=None, use_deterministic_algorithm=False, name="",
                      **mask):
        ATTENTION_CALLS.append(dict(mask, kind="sdpa_backward", attn_scale=attn_scale,
                                    use_deterministic_algorithm=use_deterministic_algorithm))
        return self._node("sdpa_backward", dict(q=q, k=k, v=v, o=o, dO=dO, stats=stats),
                          dict(mask, scale=attn_scale, deterministic=use_deterministic_algorithm), results=3)

    def validate(self):
        for tensor in self.tensors:
            if tensor.output:
                assert tensor.dim and tensor.stride and tensor.data_type is not None, \
                    f"{tensor.name}: a result's dims, strides and dtype are named"
        self.state = "validated"

    def build_operation_graph(self):
        assert self.state == "validated"
        self.state = "operation graph"

    def deselect_numeric_notes(self, notes):
        self.numerics |= set(notes)

    def deselect_behavior_notes(self, notes):
        self.behaviours |= set(notes)

    def create_execution_plans(self, modes):
        assert self.state == "operation graph" and self.plans == [], "planning is one-shot"
        kinds = {node.kind for node in self.nodes}
        assert "sdpa_backward" not in kinds or self.nodes[-1].params["deterministic"], \
            "an attention backward must ask for the deterministic algorithm"
        if not kinds & DECLINED:
            for mode in modes:
                self.plans += PLANS[mode.name]
        if not self.plans:
            raise cudnnGraphNotSupportedError(f"No valid engine configs for {'+'.join(n.kind for n in self.nodes)}")

    def get_execution_plan_count(self):
        return len(self.plans)

    def get_engine_and_knobs_at_index(self, index):
        plan = self.plans[index]
        return plan.engine, {knob_type(knob): value for knob, value in plan.knobs.items()}

    def get_behavior_notes_for_plan_at_index(self, index):
        return list(self.plans[index].behaviours)

    def build_plan_at_index(self, index):
        plan = self.plans[index]
        if set(plan.numerics) & self.numerics or set(plan.behaviours) & self.behaviours:
            raise RuntimeError("Deselecting execution plan")
        if not plan.builds:
            raise cudnnGraphNotSupportedError("plan does not build")
        self.built.add(index)
        return self

    def get_workspace_size_plan_at_index(self, index):
        assert index in self.built
        return self.plans[index].workspace

    def execute_plan_at_index(self, pack, workspace=None, index=0, handle=None):
        assert index in self.built and handle in HANDLES
        bound = [tensor for tensor in self.tensors if not tensor.virtual]
        for tensor in bound:
            buffer = pack[tensor]
            assert list(buffer.shape) == tensor.dim and list(buffer.stride()) == tensor.stride, \
                (tensor.name, tuple(buffer.shape), buffer.stride(), tensor.dim, tensor.stride)
        assert (workspace is None) == (self.plans[index].workspace == 0)
        if workspace is not None:
            assert workspace.numel() * workspace.element_size() >= self.plans[index].workspace
        values = {tensor: pack[tensor].float() for tensor in bound if not tensor.output}
        for node in self.nodes:
            found = COMPUTE[node.kind](node, *[values[tensor] for tensor in node.inputs.values()])
            values.update(zip(node.results, found if isinstance(found, tuple) else (found,)))
        for tensor in bound:
            if tensor.output:
                pack[tensor].copy_(values[tensor])
        EXECUTED.append((self.plans[index].engine, "+".join(node.kind for node in self.nodes),
                         tuple(tuple(pack[tensor].shape) for tensor in bound)))


def _convolution(node, first, second):
    import torch
    import torch.nn.functional as functional

    geometry = dict(stride=tuple(node.params["stride"]), padding=tuple(node.params["padding"]))
    shape = tuple(node.results[0].dim)  # a cotangent's shape is named: strides make it ambiguous
    if node.kind == "fprop":
        return functional.conv2d(first, second, **geometry)
    if node.kind == "dgrad":
        return torch.nn.grad.conv2d_input(shape, second, first, **geometry)
    return torch.nn.grad.conv2d_weight(first, shape, second, **geometry)


def _scores(q, k, scale, mask):
    import torch

    scores = (q @ k.transpose(-1, -2)) * scale
    if mask.get("diagonal_band_right_bound") == 0:
        assert mask.get("diagonal_alignment") == diagonal_alignment.TOP_LEFT
        rows, cols = scores.shape[-2:]
        later = torch.ones(rows, cols, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(later, -math.inf)
    return scores


def _sdpa(q, k, v, scale, **mask):
    scores = _scores(q, k, scale, mask)
    stats = scores.logsumexp(-1, keepdim=True)
    return (scores - stats).exp() @ v, stats


def _sdpa_backward(q, k, v, o, d_o, stats, scale, deterministic, **mask):
    probabilities = (_scores(q, k, scale, mask) - stats).exp()
    delta = (d_o * o).sum(-1, keepdim=True)
    d_scores = probabilities * (d_o @ v.transpose(-1, -2) - delta)
    return (d_scores @ k) * scale, (d_scores.transpose(-1, -2) @ q) * scale, probabilities.transpose(-1, -2) @ d_o


def _gelu(x):
    import torch

    return x * 0.5 * (1 + torch.erf(x / math.sqrt(2.0)))


COMPUTE = {  # kind -> compute(node, *inputs): the node's results in float32
    "fprop": _convolution,
    "dgrad": _convolution,
    "wgrad": _convolution,
    "matmul": lambda node, a, b: a @ b,
    "add": lambda node, a, b: a + b,
    "relu": lambda node, x: x.clamp_min(0),
    "gelu": lambda node, x: _gelu(x),
    "sdpa": lambda node, q, k, v: _sdpa(q, k, v, **node.params),
    "sdpa_backward": lambda node, *operands: _sdpa_backward(*operands, **node.params),
}


def installed(monkeypatch, plans: dict):
    """This module in the real frontend's place for one test, on the CPU, listing `plans`
    (mode name -> [Plan]); every plan, handle and record of an earlier test is dropped."""
    from sexpgpu.backends.cuda import cudnn_engines

    PLANS.clear()
    PLANS.update({mode: list(listed) for mode, listed in plans.items()})
    for kept in (EXECUTED, ATTENTION_CALLS, GRAPHS, DECLINED):
        kept.clear()
    monkeypatch.setattr(cudnn_engines, "_found", {"module": sys.modules[__name__], "why": None})
    monkeypatch.setattr(cudnn_engines, "_plans", {})
    monkeypatch.setattr(cudnn_engines, "_handles", {})
    monkeypatch.setattr(cudnn_engines, "current_device", lambda: 0)
    monkeypatch.setattr(cudnn_engines, "on_device", lambda index: _Nowhere())
    monkeypatch.setattr(cudnn_engines, "current_stream", lambda: 0)


class _Nowhere:
    """No device to make the handle and plans on: the CPU."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
