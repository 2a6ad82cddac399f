"""Convolution and pooling (the op table's window ops) through cuDNN and PyTorch.

A convolution the plan chose a cuDNN engine for (FusionPolicy.convolutions, keyed by
backends/cuda/convolutions.py's ConvolutionKey.key()) runs that engine's plan through cuDNN's
frontend (cudnn_engines.py), straight into its buffer, with a workspace in the arena. Any
other convolution (no frontend, no engine offered, or a policy that names none) runs cuDNN
through PyTorch with `torch.backends.cudnn.deterministic` on and benchmarking off
(device.py): cuDNN takes the first deterministic algorithm its heuristics offer for the
role (forward, backward-data, backward-filter), shape and dtype. Either way TF32 is off, and
bf16 convolutions accumulate in float32 and round once.

Pooling: max and average pooling are PyTorch's; the gradient of max pooling routes each
window's cotangent to its first maximum, found by PyTorch's max pooling with indices, and
adds them with `scatter_add_`, which PyTorch's deterministic mode runs without atomics.
"""

from __future__ import annotations

from sexpgpu.backends.cuda.launches import TorchLaunch, reads_of
from sexpgpu.backends.cuda.convolutions import convolution_key
from sexpgpu.graph.core.rules import RuleTable

WINDOWS = RuleTable("cuda windows", needs=lambda op: op.kind == "window")


def _window_launch(lowerer, node, compute, kind: str, in_float32: bool = False) -> None:
    """A launch writing `compute(*tensors)` (the node's inputs as tensors) into its buffer.
    With `in_float32`, bf16 inputs are widened first, so the result is rounded once, by the
    copy into the buffer, where the interpreter rounds it (PyTorch's bf16 pooling rounds each
    window's share apart)."""
    widen = (lambda tensor: tensor.float()) if in_float32 else (lambda tensor: tensor)
    lowerer.emit_torch(node, kind, lambda out, *tensors: out.copy_(compute(*[widen(tensor) for tensor in tensors])))


def _engine_launch(lowerer, node, engine: str) -> None:
    """The convolution run by the chosen engine: its inputs as contiguous tensors (the
    layout the engine's plan was built for; a view that is not one is copied), its result
    written in place, its workspace an arena buffer the launch alone writes."""
    from sexpgpu.backends.cuda import cudnn_engines

    plan = cudnn_engines.prepared(convolution_key(node), engine, cudnn_engines.current_device())
    sources = lowerer.operands(node.inputs)
    key = lowerer.result_buffer(node)
    writes = (key,)
    if plan.workspace_bytes:
        writes += (lowerer.new_buffer("f32", (-(-plan.workspace_bytes // 4),)),)

    def run(env):
        first, second = (source.strided(env).contiguous() for source in sources)
        plan.run(first, second, env[key], env[writes[1]] if len(writes) > 1 else None)

    lowerer.emit_result(node, TorchLaunch(run, reads_of(sources), writes, "convolution", engine=engine))


def _convolution(lowerer, node, compute) -> None:
    """The plan's engine for this convolution when it chose one, else PyTorch's call."""
    engine = lowerer.policy.convolutions.get(convolution_key(node).key())
    if engine is not None:
        _engine_launch(lowerer, node, engine)
    else:
        _window_launch(lowerer, node, compute, "convolution")


@WINDOWS.rule("conv2d")
def conv2d(lowerer, node) -> None:
    import torch.nn.functional as functional

    stride, padding = node.attrs["stride"], node.attrs["padding"]
    _convolution(lowerer, node, lambda x, w: functional.conv2d(x, w, stride=stride, padding=padding))


@WINDOWS.rule("conv2d_input_grad")
def conv2d_input_grad(lowerer, node) -> None:
    import torch

    stride, padding, shape = node.attrs["stride"], node.attrs["padding"], node.attrs["input_shape"]
    compute = lambda g, w: torch.nn.grad.conv2d_input(shape, w, g, stride=stride, padding=padding)  # noqa: E731
    _convolution(lowerer, node, compute)


@WINDOWS.rule("conv2d_weight_grad")
def conv2d_weight_grad(lowerer, node) -> None:
    import torch

    stride, padding, shape = node.attrs["stride"], node.attrs["padding"], node.attrs["weight_shape"]
    compute = lambda x, g: torch.nn.grad.conv2d_weight(x, shape, g, stride=stride, padding=padding)  # noqa: E731
    _convolution(lowerer, node, compute)


@WINDOWS.rule("max_pool2d")
def max_pool2d(lowerer, node) -> None:
    import torch.nn.functional as functional

    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    _window_launch(lowerer, node, lambda x: functional.max_pool2d(x, kernel, stride), "pooling")


def _first_maxima(x, kernel, stride):
    """The flat (row * W + column) index in its image plane of each window's maximum, a row
    a plane (N * C rows), and the pooled shape."""
    import torch.nn.functional as functional

    _, indices = functional.max_pool2d(x, kernel, stride, return_indices=True)
    return indices.reshape(x.shape[0] * x.shape[1], -1), indices.shape


@WINDOWS.rule("max_pool2d_grad")
def max_pool2d_grad(lowerer, node) -> None:
    import torch

    kernel, stride = node.attrs["kernel"], node.attrs["stride"]

    def compute(x, g):
        indices, _ = _first_maxima(x, kernel, stride)
        out = torch.zeros((indices.shape[0], x.shape[2] * x.shape[3]), dtype=torch.float32, device=x.device)
        out.scatter_add_(1, indices, g.reshape(indices.shape[0], -1).float())
        return out.reshape(x.shape)

    _window_launch(lowerer, node, compute, "pooling")


@WINDOWS.rule("max_pool2d_pick")
def max_pool2d_pick(lowerer, node) -> None:
    kernel, stride = node.attrs["kernel"], node.attrs["stride"]

    def compute(x, h):
        indices, pooled = _first_maxima(x, kernel, stride)
        return h.reshape(indices.shape[0], -1).gather(1, indices).reshape(pooled)

    _window_launch(lowerer, node, compute, "pooling")


@WINDOWS.rule("avg_pool2d")
def avg_pool2d(lowerer, node) -> None:
    import torch.nn.functional as functional

    kernel, stride = node.attrs["kernel"], node.attrs["stride"]
    _window_launch(lowerer, node, lambda x: functional.avg_pool2d(x, kernel, stride), "pooling", in_float32=True)


@WINDOWS.rule("avg_pool2d_grad")
def avg_pool2d_grad(lowerer, node) -> None:
    import torch

    kernel, stride, shape = node.attrs["kernel"], node.attrs["stride"], node.attrs["input_shape"]

    def compute(g):
        like = g.new_empty(()).expand(shape)  # only its shape is read
        return torch.ops.aten.avg_pool2d_backward(g, like, list(kernel), list(stride), [0, 0], False, True, None)

    _window_launch(lowerer, node, compute, "pooling", in_float32=True)
