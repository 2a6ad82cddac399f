"""cuDNN convolution engines through cuDNN's frontend: which engines cuDNN offers for a
convolution on this device, and running one of them.

The frontend is the optional package `nvidia-cudnn-frontend` (`pip install 'sexpgpu[cudnn]'`),
imported as `cudnn` at the first question, never with this module. Without it, `offered`
answers () and `unavailable()` says why; the plan then records no engine and the
convolutions run PyTorch's cuDNN lowering (windows.py).

For a convolution (backends/cuda/convolutions.py's ConvolutionKey) a frontend graph of one
conv_fprop, conv_dgrad or conv_wgrad node is built over NCHW tensors in contiguous layout
(the layout of the lowering's buffers), float32 compute and the key's dtype for the
operands. Its plans are cuDNN's heuristics, mode A then the fallback list, in their order;
each mode's list is asked of a graph of its own, so that each plan's notes are read at its
own index (a frontend that appends a second mode's plans to one list may read them at the
first mode's). A plan is offered when it is one of cuDNN's own engines (not one of the frontend's Python
engines), it carries none of the notes below, and it builds here:

- NONDETERMINISTIC: it may sum in an order that changes from call to call;
- DOWN_CONVERT_INPUTS, and TENSOR_CORE for float32: its inputs are rounded (to TF32 for a
  float32 convolution), which the rest of the backend never does (device.py: TF32 off);
- REDUCED_PRECISION_REDUCTION: a bf16 convolution would sum in bf16, not float32;
- FFT and WINOGRAD (any tile): their transforms round otherwise than a sum of products, so
  the result would differ from the interpreter's by more than the order of a sum;
- RUNTIME_COMPILATION (a behaviour note): its kernel is compiled when the plan is built,
  which takes seconds a plan and puts the runtime compiler's version in the bits.

So every engine offered repeats its bits run to run, and two engines round differently.
An engine is named by its `Engine.text()`; the plans of a convolution are built once in a
process and shared by every graph that runs it. The plan (plan/choices.py) chooses among
them; this module only lists, builds and runs.

cuDNN's native pattern graphs (cudnn_patterns.py) are listed, built and run the same way:
`plans_for` takes another graph builder for their keys, with the same notes left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sexpgpu.backends.cuda.convolutions import ConvolutionKey, engine_of

FRONTEND = "nvidia-cudnn-frontend"
BACKEND_ENGINES = 10_000  # the frontend's engine ids below this are cuDNN's; above, its Python engines
LEFT_OUT_NUMERICS = ("NONDETERMINISTIC", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT", "WINOGRAD",
                     "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13")
LEFT_OUT_F32 = ("TENSOR_CORE",)
LEFT_OUT_BEHAVIOURS = ("RUNTIME_COMPILATION",)
HEURISTICS = ("A", "FALLBACK")

_found: dict = {}  # "module" and "why", once a process
_handles: dict = {}  # device index -> the frontend's cuDNN handle
_plans: dict = {}  # (a key: ConvolutionKey, or a pattern graph's, device index) -> Plans


def frontend():
    """The `cudnn` module, or None when it cannot be used here (`unavailable()` says why)."""
    if "module" not in _found:
        _found.update(module=None, why=None)
        try:
            import torch  # noqa: F401  (loads cuDNN's library, which the frontend finds loaded)
            import cudnn
        except ImportError:
            _found["why"] = f"cuDNN's frontend ({FRONTEND}, the extra `cudnn`) is not installed"
            return None
        except Exception as error:  # a broken installation: the message names it
            _found["why"] = f"cuDNN's frontend cannot be imported ({type(error).__name__}: {error})"
            return None
        try:
            cudnn.backend_version()
        except Exception as error:
            _found["why"] = f"cuDNN's frontend {getattr(cudnn, '__version__', '')} finds no cuDNN library ({error})"
            return None
        _found["module"] = cudnn
    return _found["module"]


def unavailable() -> str | None:
    frontend()
    return _found["why"]


def frontend_version() -> str | None:
    module = frontend()
    return getattr(module, "__version__", None) if module is not None else None


@dataclass(frozen=True)
class Graph:
    """One heuristics mode's frontend graph of a convolution."""

    graph: object
    operands: tuple  # the graph's tensors: (first input, second input, result), the node's order
    mode: str


@dataclass
class Plans:
    """One convolution's (or pattern graph's) frontend graphs with their offered plans built."""

    key: object
    handle: object = None
    graphs: list = field(default_factory=list)  # one Graph a heuristics mode that cuDNN answered
    indices: dict = field(default_factory=dict)  # engine text -> (Graph, plan index), in the heuristics' order
    plan_count: int = 0  # plans the heuristics listed, offered or not
    declined: str = ""  # why cuDNN offers nothing for this convolution, when it does not


def offered(key: ConvolutionKey, device_index: int) -> tuple:
    """The engines offered for `key` on this device, in the heuristics' order."""
    return tuple(plans_for(key, device_index).indices)


def plans_for(key, device_index: int, builder=None, limit: int | None = None) -> Plans:
    """The offered plans of `key`'s graph, built once a process: a convolution's by default,
    or `builder(cudnn, key, handle) -> (graph, operands)`'s for another key (which has a
    `dtype`); with `limit`, only the first `limit` offered are built."""
    found = _plans.get((key, device_index))
    if found is None:
        found = _plans[(key, device_index)] = _build(key, device_index, builder or _graph, limit)
    return found


def _build(key, device_index: int, builder, limit: int | None) -> Plans:
    cudnn = frontend()
    plans = Plans(key)
    if cudnn is None:
        plans.declined = unavailable() or ""
        return plans
    with on_device(device_index):
        plans.handle = _handle(cudnn, device_index)
        for mode in HEURISTICS:
            if limit is not None and len(plans.indices) >= limit:
                break
            try:
                graph = _planned(cudnn, key, plans.handle, mode, builder)
            except Exception as error:  # cuDNN declines the graph in this mode: it has no plans from it
                plans.declined += f"{'; ' if plans.declined else ''}{mode}: {type(error).__name__}: {error}"
                continue
            plans.graphs.append(graph)
            count = graph.graph.get_execution_plan_count()
            plans.plan_count += count
            for index in range(count):
                if limit is not None and len(plans.indices) >= limit:
                    break
                text = _offered_plan(cudnn, key, graph.graph, index)
                if text is not None and text not in plans.indices:
                    plans.indices[text] = (graph, index)
    return plans


def _planned(cudnn, key, handle, mode: str, builder) -> Graph:
    """The key's graph with the heuristics' plans of one mode, the left-out notes deselected."""
    graph, operands = builder(cudnn, key, handle)
    graph.validate()
    graph.build_operation_graph()
    graph.deselect_numeric_notes(_notes(cudnn.numerical_note, _left_out_numerics(key)))
    graph.deselect_behavior_notes(_notes(cudnn.behavior_note, _left_out_behaviours(key)))
    graph.create_execution_plans([getattr(cudnn.heur_mode, mode)])
    return Graph(graph, operands, mode)


def _notes(kind, names) -> list:
    """The notes of these names that this frontend knows (a note it lacks no plan carries)."""
    return [getattr(kind, name) for name in names if hasattr(kind, name)]


def current_device() -> int:
    """The CUDA device the lowering runs on (PyTorch's current one)."""
    import torch

    return torch.cuda.current_device()


def on_device(device_index: int):
    """A context in which the frontend's handle and plans are made for that device."""
    import torch

    return torch.cuda.device(device_index)


def current_stream() -> int:
    """PyTorch's current stream, the one a CUDA graph capture records."""
    import torch

    return torch.cuda.current_stream().cuda_stream


def _left_out_numerics(key) -> tuple:
    return LEFT_OUT_NUMERICS + (LEFT_OUT_F32 if key.dtype == "f32" else ())


def _left_out_behaviours(key) -> tuple:
    """A convolution's engines leave out run-time compiled kernels; a pattern graph's keep them:
    cuDNN's fused attention and epilogue fusions come only as such (every plan of the H200's
    cuDNN 9.19 for them is RUNTIME_COMPILATION), and their bits are then cuDNN's and its
    compiler's, which the recorded device facts name."""
    return LEFT_OUT_BEHAVIOURS if isinstance(key, ConvolutionKey) else ()


def _offered_plan(cudnn, key, graph, index: int) -> str | None:
    """The engine text of plan `index` when it is offered: a cuDNN engine whose notes are
    none of the left-out ones (the deselected ones fail to build) and that builds here."""
    try:
        engine, knobs = graph.get_engine_and_knobs_at_index(index)
        if not 0 <= int(engine) < BACKEND_ENGINES:
            return None
        left_out = _notes(cudnn.behavior_note, _left_out_behaviours(key))
        if any(note in left_out for note in graph.get_behavior_notes_for_plan_at_index(index)):
            return None
        graph.build_plan_at_index(index)
    except Exception:  # a plan cuDNN cannot build here, or one deselected by its notes
        return None
    return engine_of(engine, knobs or {}).text()


def _handle(cudnn, device_index: int):
    if device_index not in _handles:
        _handles[device_index] = cudnn.create_handle()
    return _handles[device_index]


def _graph(cudnn, key: ConvolutionKey, handle):
    """The frontend graph of the key's convolution and its (input, input, result) tensors."""
    dtype = cudnn.data_type.BFLOAT16 if key.dtype == "bf16" else cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=dtype, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)

    def tensor(name, shape):
        return graph.tensor(name=name, dim=list(shape), stride=contiguous(shape), data_type=dtype)

    geometry = {"padding": list(key.padding), "stride": list(key.stride), "dilation": [1, 1]}
    first_shape, second_shape, result_shape = operand_shapes(key)
    first, second = tensor("a", first_shape), tensor("b", second_shape)
    if key.role == "Forward":
        result = graph.conv_fprop(image=first, weight=second, **geometry)
    elif key.role == "Data":
        result = graph.conv_dgrad(loss=first, filter=second, **geometry)
    else:
        result = graph.conv_wgrad(image=first, loss=second, **geometry)
    # backward-data and backward-filter results cannot be inferred from their inputs: named here
    result.set_output(True).set_data_type(dtype).set_dim(list(result_shape)).set_stride(contiguous(result_shape))
    return graph, (first, second, result)


def operand_shapes(key: ConvolutionKey) -> tuple:
    """(first input, second input, result) shapes, in the order the graph's node takes them:
    forward (image, weight) -> output; data (output cotangent, weight) -> image cotangent;
    weight (image, output cotangent) -> weight cotangent."""
    return {
        "Forward": (key.image, key.weight, key.result),
        "Data": (key.result, key.weight, key.image),
        "Weight": (key.image, key.result, key.weight),
    }[key.role]


def contiguous(shape) -> list:
    strides, stride = [], 1
    for size in reversed(tuple(shape)):
        strides.append(stride)
        stride *= int(size)
    return strides[::-1]


@dataclass(frozen=True)
class Prepared:
    """One engine of one convolution, built: what a lowering launch runs."""

    graph: Graph
    index: int
    handle: object
    workspace_bytes: int

    def run(self, first, second, result, workspace) -> None:
        """result = the convolution of (first, second): contiguous device tensors, written on
        PyTorch's current stream (so a CUDA graph capture records it)."""
        self.execute((first, second, result), workspace)

    def execute(self, tensors, workspace) -> None:
        """The plan on device tensors, one for each of the graph's operands in its order
        (inputs and results alike), on PyTorch's current stream."""
        frontend().set_stream(self.handle, current_stream())
        pack = dict(zip(self.graph.operands, tensors))
        self.graph.graph.execute_plan_at_index(pack, workspace if self.workspace_bytes else None, index=self.index,
                                               handle=self.handle)


def prepared(key, engine: str, device_index: int, builder=None) -> Prepared:
    """The built plan of `engine` for `key`; a ValueError when it is not offered here (the
    plan checks a pin against `offered` before handing an engine over)."""
    plans = plans_for(key, device_index, builder)
    found = plans.indices.get(engine)
    if found is None:
        why = plans.declined or unavailable() or f"offered: {', '.join(plans.indices) or 'none'}"
        raise ValueError(f"convolution {key.key()}: cuDNN does not offer '{engine}' here ({why})")
    graph, index = found
    return Prepared(graph, index, plans.handle, int(graph.graph.get_workspace_size_plan_at_index(index)))
