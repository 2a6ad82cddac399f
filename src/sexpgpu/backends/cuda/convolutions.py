"""A convolution as the plan sees it, and a cuDNN engine as a record names it.

A `convolutions` map (determinism.md, "The record") has one entry per convolution the run
executes: the key is `ConvolutionKey.key()`, the value `Engine.text()`:

    "Weight Spec { batch: 512, height: 8, width: 8, channels: 256, kh: 3, kw: 3, out: 512,
     stride: 1, padding: 1 } bf16": "engine 47 knobs 2=3 5=3 14=2"

The key names the role (Forward: conv2d; Data: its input's cotangent, cuDNN's backward-data;
Weight: its weight's cotangent, backward-filter), the forward convolution's geometry (the
image's batch, height, width and channels, the kernel's height and width, the output
channels, stride and padding, each one number when equal on both axes, else `(h, w)`) and
the dtype of the operands. The value names the cuDNN engine id and its knobs as
`<knob type number>=<value>`, in increasing knob order (`knobs` alone when it has none).
Both formats are stable: a record written by one version is read by the next.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ROLES = {"conv2d": "Forward", "conv2d_input_grad": "Data", "conv2d_weight_grad": "Weight"}
_ENGINE = re.compile(r"^engine (\d+) knobs((?: \d+=-?\d+)*)$")


@dataclass(frozen=True)
class ConvolutionKey:
    role: str  # one of ROLES' values
    batch: int
    height: int
    width: int
    channels: int
    kh: int
    kw: int
    out: int
    stride: tuple  # (along height, along width)
    padding: tuple
    dtype: str  # "f32" or "bf16"

    def key(self) -> str:
        return (f"{self.role} Spec {{ batch: {self.batch}, height: {self.height}, width: {self.width}, "
                f"channels: {self.channels}, kh: {self.kh}, kw: {self.kw}, out: {self.out}, "
                f"stride: {_pair(self.stride)}, padding: {_pair(self.padding)} }} {self.dtype}")

    @property
    def image(self) -> tuple:
        return (self.batch, self.channels, self.height, self.width)

    @property
    def weight(self) -> tuple:
        return (self.out, self.channels, self.kh, self.kw)

    @property
    def result(self) -> tuple:
        """The forward convolution's output shape (N, O, OH, OW)."""
        rows = (self.height + 2 * self.padding[0] - self.kh) // self.stride[0] + 1
        cols = (self.width + 2 * self.padding[1] - self.kw) // self.stride[1] + 1
        return (self.batch, self.out, rows, cols)


def _pair(values) -> str:
    return str(values[0]) if values[0] == values[1] else f"({values[0]}, {values[1]})"


def convolution_key(node) -> ConvolutionKey | None:
    """The key of a window node that is a convolution or one of its cotangents; None for
    any other node."""
    role = ROLES.get(node.op)
    if role is None:
        return None
    image = node.attrs["input_shape"] if node.op == "conv2d_input_grad" else node.inputs[0].shape
    weight = node.attrs["weight_shape"] if node.op == "conv2d_weight_grad" else node.inputs[1].shape
    batch, channels, height, width = (int(size) for size in image)
    out, _, kh, kw = (int(size) for size in weight)
    return ConvolutionKey(role, batch, height, width, channels, kh, kw, out,
                          tuple(int(v) for v in node.attrs["stride"]), tuple(int(v) for v in node.attrs["padding"]),
                          node.inputs[0].dtype)


def graph_convolutions(graph) -> tuple:
    """The convolution keys of `graph`, each once, in the graph's order."""
    keys = (convolution_key(node) for node in graph.nodes)
    return tuple(dict.fromkeys(key for key in keys if key is not None))


@dataclass(frozen=True)
class Engine:
    """A cuDNN engine and its knob choices: what rebuilds one execution plan."""

    engine: int
    knobs: tuple = ()  # ((knob type number, value), ...) in increasing knob order

    def text(self) -> str:
        return f"engine {self.engine} knobs" + "".join(f" {knob}={value}" for knob, value in self.knobs)


def engine_of(engine: int, knobs: dict) -> Engine:
    return Engine(int(engine), tuple(sorted((int(knob), int(value)) for knob, value in knobs.items())))


def parse_engine(text) -> Engine | None:
    """The engine a recorded value names; None when the text is not of `Engine.text()`'s form."""
    match = _ENGINE.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    knobs = tuple(tuple(int(part) for part in item.split("=")) for item in match.group(2).split())
    return Engine(int(match.group(1)), knobs)
