"""cuDNN's native pattern graphs (backends/cuda/patterns.py) through cuDNN's frontend: where this device
supports each pattern, the frontend graph of each match (the table `BUILDERS`: pattern ->
graph builder), and the first plan cuDNN offers for it.

A match's graph is built for the layout its operands have in the lowering (pattern_launches.py
gives each operand's dims and strides), with float32 compute and intermediates:

- attention, forward: sdpa(q, k, v) -> o, and each query's log-sum-exp (`Stats`, float32)
  when a backward reads it; the op's causal mask is cuDNN's top-left aligned diagonal band
  with right bound 0 (query i sees keys 0..i);
- attention, backward: sdpa_backward(q, k, v, o, dO, Stats) -> dQ, dK, dV with
  `use_deterministic_algorithm=True`: dQ is summed over key blocks in a fixed order, not by
  atomics, so the backward repeats its bits;
- products and convolutions: matmul (or conv_fprop) -> add the float32 bias -> relu or gelu,
  every intermediate float32; the biased sum is written too when the activation's gradient
  reads it.

Plans are listed, built and run as the convolution engines are (cudnn_engines.py: cuDNN's own
engines only, none of its nondeterministic, down-converting, reduced-precision or transformed
ones, TF32 left out for float32), except that run-time compiled plans are kept: cuDNN's fused
graphs come only so. A match takes the first offered,
in the heuristics' order: a fact of the device and its cuDNN, so two machines with equal
device facts lower it alike. A match cuDNN declines is lowered as without patterns.
"""

from __future__ import annotations

from dataclasses import dataclass

from sexpgpu.backends.cuda import cudnn_engines
from sexpgpu.backends.cuda.patterns import PATTERN_NAMES

# The first cuDNN with each graph as built here: the matmul and convolution fusions with
# float32 epilogues from 9.0; fused attention from 9.13, which fixed Hopper's backward for
# some head widths (determinism.md in the spec names 9.13.0 for attention).
MIN_CUDNN = {"attention": 91300, "products": 90000, "convolutions": 90000}
INTERPRETED = "the backend runs under Triton's interpreter on the CPU, and cuDNN's graphs run on a GPU"
# Patterns held off where cuDNN offers them, from tests/cuda/test_patterns_gpu.py on the H200
# with cuDNN 9.19: every fused convolution plan failed at execution (CUDNN_STATUS_INTERNAL_ERROR,
# an operand's pointer null), and a product + bias + relu graph gave wrong values (with gelu,
# or the bias alone, it matched). Until a GPU run shows otherwise, the backend's own lowering
# computes them; fused attention passed every test and is on.
HELD_OFF = {
    "products": "held off: a product + bias + relu graph gave wrong values on the H200 with cuDNN 9.19",
    "convolutions": "held off: cuDNN 9.19's fused convolution plans failed at execution on the H200",
}


@dataclass(frozen=True)
class Layout:
    """An operand of a pattern graph as the graph declares it."""

    dims: tuple
    strides: tuple
    dtype: str  # "f32" or "bf16"


@dataclass(frozen=True)
class PatternGraph:
    """A match's cuDNN graph: its pattern, key, and each operand's layout, in its builder's
    order (the inputs, then the results)."""

    pattern: str
    key: object  # backends/cuda/patterns.py's AttentionKey or EpilogueKey
    layouts: tuple

    @property
    def dtype(self) -> str:  # the notes left out depend on it (cudnn_engines.py)
        return self.key.dtype


def support(device) -> dict:
    """{pattern name: None where cuDNN supports it on this device, else why not}."""
    why = INTERPRETED if device.type != "cuda" else None
    cudnn = cudnn_engines.frontend() if why is None else None
    if why is None and cudnn is None:
        why = cudnn_engines.unavailable()
    if why is not None:
        return {name: why for name in PATTERN_NAMES}
    version = int(cudnn.backend_version())
    return {name: HELD_OFF.get(name) if version >= MIN_CUDNN[name] else
            f"cuDNN {version} is older than {MIN_CUDNN[name]}, the first with its graph" for name in PATTERN_NAMES}


def first_plan(planned: PatternGraph, device_index: int):
    """(the first offered plan of the match's graph, built, with its engine text) or
    (None, why cuDNN offers none)."""
    plans = cudnn_engines.plans_for(planned, device_index, BUILDERS[planned.pattern], limit=1)
    if not plans.indices:
        return None, plans.declined or (f"none of the {plans.plan_count} plans its heuristics list is deterministic "
                                         "with float32 sums, precompiled and built here")
    engine, (graph, index) = next(iter(plans.indices.items()))
    workspace = int(graph.graph.get_workspace_size_plan_at_index(index))
    return cudnn_engines.Prepared(graph, index, plans.handle, workspace), engine


# --- the builders ---------------------------------------------------------------------------

def _data_type(cudnn, dtype: str):
    return cudnn.data_type.BFLOAT16 if dtype == "bf16" else cudnn.data_type.FLOAT


def _pygraph(cudnn, dtype: str, handle):
    return cudnn.pygraph(io_data_type=_data_type(cudnn, dtype), intermediate_data_type=cudnn.data_type.FLOAT,
                         compute_data_type=cudnn.data_type.FLOAT, handle=handle)


def _inputs(cudnn, graph, names: str, layouts) -> list:
    return [graph.tensor(name=name, dim=list(layout.dims), stride=list(layout.strides),
                         data_type=_data_type(cudnn, layout.dtype)) for name, layout in zip(names, layouts)]


def _results(cudnn, tensors, layouts) -> list:
    """The node's result tensors made outputs with the layouts the lowering's buffers have."""
    return [tensor.set_output(True).set_data_type(_data_type(cudnn, layout.dtype)).set_dim(list(layout.dims))
            .set_stride(list(layout.strides)) for tensor, layout in zip(tensors, layouts)]


def _mask(cudnn, key) -> dict:
    """The op's causal mask (TQ == TK, query i sees keys 0..i) as cuDNN's diagonal band."""
    if not key.causal:
        return {}
    return {"diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT, "diagonal_band_right_bound": 0}


def _attention_forward(cudnn, planned: PatternGraph, handle):
    key, layouts = planned.key, planned.layouts
    graph = _pygraph(cudnn, key.dtype, handle)
    q, k, v = _inputs(cudnn, graph, "qkv", layouts)
    o, stats = graph.sdpa(name="attention", q=q, k=k, v=v, generate_stats=key.stats, attn_scale=key.scale,
                          **_mask(cudnn, key))
    results = _results(cudnn, [o, stats] if key.stats else [o], layouts[3:])
    return graph, (q, k, v, *results)


def _attention_backward(cudnn, planned: PatternGraph, handle):
    key, layouts = planned.key, planned.layouts
    graph = _pygraph(cudnn, key.dtype, handle)
    q, k, v, o, cotangent, stats = _inputs(cudnn, graph, ("q", "k", "v", "o", "dO", "stats"), layouts)
    grads = graph.sdpa_backward(name="attention_backward", q=q, k=k, v=v, o=o, dO=cotangent, stats=stats,
                                attn_scale=key.scale, use_deterministic_algorithm=True, **_mask(cudnn, key))
    return graph, (q, k, v, o, cotangent, stats, *_results(cudnn, grads, layouts[6:]))


def _attention(cudnn, planned: PatternGraph, handle):
    return {"Forward": _attention_forward, "Backward": _attention_backward}[planned.key.role](cudnn, planned, handle)


def _matrix_product(cudnn, graph, a, b, product):
    return graph.matmul(A=a, B=b, compute_data_type=cudnn.data_type.FLOAT, name="product")


def _convolution(cudnn, graph, image, weight, product):
    return graph.conv_fprop(image=image, weight=weight, padding=list(product.padding), stride=list(product.stride),
                            dilation=[1, 1], name="product")


def _epilogue(cudnn, planned: PatternGraph, handle):
    """product -> + bias -> activation, in float32; the biased sum is an output when kept."""
    key, layouts = planned.key, planned.layouts
    graph = _pygraph(cudnn, key.dtype, handle)
    a, b, bias = _inputs(cudnn, graph, ("a", "b", "bias"), layouts)
    product = _convolution if planned.pattern == "convolutions" else _matrix_product
    summed = graph.add(a=product(cudnn, graph, a, b, key.product), b=bias, name="bias")
    produced = [summed] if key.activation is None or key.keeps_sum else []
    if key.activation is not None:
        produced.append(getattr(graph, key.activation)(input=summed, name="activation"))
    return graph, (a, b, bias, *_results(cudnn, produced, layouts[3:]))


BUILDERS = {"attention": _attention, "products": _epilogue, "convolutions": _epilogue}
