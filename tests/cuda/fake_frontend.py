"""A stand-in for cuDNN's frontend (`import cudnn`, the package nvidia-cudnn-frontend) on the CPU,
for tests of backends/cuda/cudnn_engines.py and the lowering's engine steps without a GPU.

It has the part of the frontend's graph API that cudnn_engines.py calls, with the
frontend's names and call order (`pygraph`, `tensor`, `conv_fprop` / `conv_dgrad` /
`conv_wgrad`, `validate`, `build_operation_graph`, `deselect_numeric_notes`,
`deselect_behavior_notes`, `create_execution_plans`, `get_execution_plan_count`,
`get_engine_and_knobs_at_index`, `get_behavior_notes_for_plan_at_index`,
`build_plan_at_index`, `get_workspace_size_plan_at_index`, `execute_plan_at_index`), and its
plans are a list the test sets: (engine id, knobs, numerical notes, behaviour notes, builds).
Executing a plan computes the convolution with PyTorch on the CPU and records which plan
ran, with which buffers. It checks what the real one would refuse: a plan deselected by
its notes, or one that does not build, raises when built; a variant pack that misses an
operand, or a buffer of another shape, raises when executed.
"""

from __future__ import annotations

import enum
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
PLANS = {"A": [], "FALLBACK": []}  # heuristics mode name -> the plans it lists, set by the test
EXECUTED: list = []  # (engine, role, shapes of the pack's buffers) of each plan executed
HANDLES: list = []


def backend_version() -> int:
    return 91900


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

    def set_output(self, value):
        self.output = value
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


class pygraph:
    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None, handle=None):
        assert handle in HANDLES and compute_data_type == data_type.FLOAT
        self.io = io_data_type
        self.tensors, self.node, self.state = [], None, "building"
        self.numerics, self.behaviours, self.plans, self.built = set(), set(), [], set()

    def tensor(self, name, dim, stride, data_type):
        self.tensors.append(Tensor(name, list(dim), list(stride), data_type))
        return self.tensors[-1]

    def _node(self, role, inputs, params):
        assert self.node is None, "one node a graph"
        assert params["dilation"] == [1, 1] and len(params["padding"]) == 2 == len(params["stride"])
        result = Tensor(f"{role}::out", [], [])
        self.node = (role, inputs, params, result)
        return result

    def conv_fprop(self, image, weight, padding, stride, dilation):
        return self._node("fprop", (image, weight), dict(padding=padding, stride=stride, dilation=dilation))

    def conv_dgrad(self, loss, filter, padding, stride, dilation):
        return self._node("dgrad", (loss, filter), dict(padding=padding, stride=stride, dilation=dilation))

    def conv_wgrad(self, image, loss, padding, stride, dilation):
        return self._node("wgrad", (image, loss), dict(padding=padding, stride=stride, dilation=dilation))

    def validate(self):
        role, inputs, params, result = self.node
        assert result.output and result.dim and result.stride, "the result's dims and strides are named"
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
        for mode in modes:
            self.plans += PLANS[mode.name]
        if not self.plans:
            raise cudnnGraphNotSupportedError("No valid engine configs")

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
        import torch
        import torch.nn.functional as functional

        assert index in self.built and handle in HANDLES
        role, (first, second), params, result = self.node
        for tensor in (first, second, result):
            buffer = pack[tensor]
            assert list(buffer.shape) == tensor.dim and list(buffer.stride()) == tensor.stride, tensor.name
        assert (workspace is None) == (self.plans[index].workspace == 0)
        if workspace is not None:
            assert workspace.numel() * workspace.element_size() >= self.plans[index].workspace
        a, b, out = (pack[tensor].float() for tensor in (first, second, result))
        geometry = dict(stride=tuple(params["stride"]), padding=tuple(params["padding"]))
        if role == "fprop":
            value = functional.conv2d(a, b, **geometry)
        elif role == "dgrad":
            value = torch.nn.grad.conv2d_input(tuple(out.shape), b, a, **geometry)
        else:
            value = torch.nn.grad.conv2d_weight(a, tuple(out.shape), b, **geometry)
        pack[result].copy_(value)
        EXECUTED.append((self.plans[index].engine, role, tuple(tuple(pack[t].shape) for t in (first, second, result))))
