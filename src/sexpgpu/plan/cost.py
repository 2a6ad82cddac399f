"""The cost model the stacking decision asks first: a training step's seconds at a stacking
degree, predicted from the device's measured throughput (plan/device.py's `Throughput`).

A stack of k microbatches runs the microbatch graph once with k times the records: its
arithmetic and the bytes of its activations grow k-fold, while its parameters are read
once and each node launches once. So a step of M microbatches at degree k costs

    (M / k) * (max(k F / flops_per_second, (P + k A) / bytes_per_second) + N * LAUNCH_SECONDS)

with F the graph's flops, A its activation bytes, P its parameter and gradient bytes and N
its nodes. The model only ranks degrees; when two are within 5 percent of each other the run
measures instead (plan/choices.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from sexpgpu.plan.device import ProductShape, Throughput

LAUNCH_SECONDS = 4e-6  # a kernel launch on a current GPU


@dataclass(frozen=True)
class GraphCost:
    flops: int
    activation_bytes: int
    parameter_bytes: int
    nodes: int


def graph_cost(graph) -> GraphCost:
    shared = {id(node) for name, node in graph.inputs.items() if not name.startswith("field/")}
    flops = sum(_flops(node) for node in graph.nodes)
    activation = sum(node.nbytes for node in graph.nodes if id(node) not in shared)
    parameters = sum(node.nbytes for name, node in list(graph.inputs.items()) + list(graph.outputs.items())
                     if name.startswith(("param/", "grad/")))
    return GraphCost(flops, activation, parameters, len(graph.nodes))


def _flops(node) -> int:
    if node.op == "matmul":
        return 2 * node.size * node.inputs[0].shape[-1]
    return node.size


@dataclass(frozen=True)
class CostModel:
    throughput: Throughput

    def step_seconds(self, training, degree: int) -> float:
        cost = graph_cost(training.micro)
        arithmetic = degree * cost.flops / self.throughput.flops_per_second
        traffic = (cost.parameter_bytes + degree * cost.activation_bytes) / self.throughput.bytes_per_second
        stacks = training.microbatches / degree
        return stacks * (max(arithmetic, traffic) + cost.nodes * LAUNCH_SECONDS)


def graph_products(graph) -> tuple:
    """Each distinct float32 product of a graph, in graph order, as a ProductShape with the
    operands' layouts the transposes that feed them: the keys of a device that runs every
    product as the graph states it (a device that folds rows names them otherwise)."""
    shapes = []
    for node in graph.nodes:
        if node.op != "matmul" or node.dtype != "f32":
            continue
        a, b = node.inputs
        shape = ProductShape(m=a.shape[-2], n=b.shape[-1], k=a.shape[-1], batch=prod(node.shape[:-2]),
                             a_transposed=a.op == "transpose", b_transposed=b.op == "transpose")
        if shape not in shapes:
            shapes.append(shape)
    return tuple(shapes)
