"""The attention ops as launches running the fused kernels of codegen/attention.py.

- attention_core: one forward kernel writes the output and each query's log-sum-exp (kept
  beside the node in `Lowerer.shared`, for the backward);
- attention_grad_q and attention_grad_kv: D = rowsum(g * o) is computed once for the pair
  (a launch of its own, shared through `Lowerer.shared`), then one kernel each; or, when the
  graph has both ops of one set of operands and dS fits in memory (codegen/attention.py,
  ds_in_memory), the first of them met lowers the pair: the dK/dV kernel also stores dS
  in a scratch buffer, and dQ is one product of it. When `o` is not
  the forward node of the same q, k, v and attributes (an op written by hand), the
  log-sum-exp is computed by a forward kernel into scratch first. The statistics are
  float32 buffers of the output's shape less its last axis, read by flat position.

q, k and v are read through the views the lowering already has (the heads split off by a
transpose view of the projections' buffer); a view whose leading axes do not fold into
(lead, heads) is copied. A result goes into a buffer laid out for its readers: when every
reader merges the heads back (the attention layer's transpose of the heads and time axes,
then a reshape to the projections' width) or is a cotangent op, the buffer holds
(..., T, heads, E) and the node is a transposed view of it, so the merge is a view too and
the products read the result where the kernel wrote it; else the node's own contiguous
shape. attention_grad_kv's dk and dv each get such a buffer when the gradient rule's two
slices are all that read it (the slices' values are then those buffers); else one buffer
holds dk then dv along the last axis, and the slices read it as views.
"""

from __future__ import annotations

from math import prod

from sexpgpu.backends.cuda.codegen.expr import load
from sexpgpu.backends.cuda.codegen.space import View, contiguous, contiguous_strides
from sexpgpu.backends.cuda.launches import TorchLaunch, reads_of, strided
from sexpgpu.graph.core.rules import RuleTable

ATTENTION = RuleTable("cuda attention", needs=lambda op: op.kind == "attention")

COTANGENTS = ("attention_grad_q", "attention_grad_kv")


def _four_axes(tensor):
    """(..., T, E) as (lead, heads, T, E): a view when the leading axes fold, else a copy."""
    lead = tuple(tensor.shape[:-2])
    heads = lead[-1] if lead else 1
    return tensor.reshape((-1, heads) + tuple(tensor.shape[-2:]))


def _tensors(env, operands) -> list:
    return [_four_axes(operand.strided(env)) for operand in operands]


def _written(env, results) -> list:
    """The results' (lead, heads, T, E) views, never copies: the kernels write through them."""
    views = []
    for key, view in results:
        tensor = strided(env, key, view)
        heads = tensor.shape[-3] if tensor.dim() > 2 else 1
        views.append(tensor.view((-1, heads) + tuple(tensor.shape[-2:])))
    return views


def _heads_merge(node) -> tuple:
    """The permutation of the attention layer's heads merge on `node`: heads and time swapped."""
    rank = node.rank
    return tuple(range(rank - 3)) + (rank - 2, rank - 3, rank - 1)


def _merged_by_every_reader(lowerer, node, also=()) -> bool:
    """Whether every reader of `node` merges its heads back, or is an op of `also` (which
    reads through any view), and the caller does not take it as an output."""
    readers = lowerer.readers.consumers[node]
    merge = _heads_merge(node) if node.rank >= 3 else None
    return bool(readers) and merge is not None and node not in lowerer.readers.outputs and all(
        (reader.op == "transpose" and tuple(reader.attrs["perm"]) == merge) or reader.op in also for reader in readers)


def _result(lowerer, node, also=()) -> tuple[str, View]:
    """(buffer, view of the node's axes) the kernel writes `node` through."""
    if not _merged_by_every_reader(lowerer, node, also):
        return lowerer.result_buffer(node), contiguous(node.shape)
    lowerer.decide(node, "every reader merges its heads back: written merged, the merge a view")
    merge = _heads_merge(node)
    layout = tuple(node.shape[axis] for axis in merge)
    strides = contiguous_strides(layout)
    return lowerer.new_buffer(node.dtype, layout), View(node.shape, tuple(strides[axis] for axis in merge))


def _forward_launch(lowerer, node, out: tuple, lse: str) -> None:
    from sexpgpu.backends.cuda.codegen.attention import run_forward

    operands = lowerer.operands(node.inputs[:3])
    scale, causal = node.attrs["scale"], node.attrs["causal"]

    def run(env):
        q, k, v = _tensors(env, operands)
        (written,) = _written(env, [out])
        run_forward(q, k, v, written, env[lse], scale, causal)

    lowerer.launches.append(TorchLaunch(run, reads_of(operands), (out[0], lse), "attention"))


@ATTENTION.rule("attention_core")
def attention_core(lowerer, node) -> None:
    out = _result(lowerer, node, also=COTANGENTS)
    lse = lowerer.new_buffer("f32", node.shape[:-1])
    _forward_launch(lowerer, node, out, lse)
    lowerer.shared[("attention lse", node)] = lse
    lowerer.values[node] = load(*out, node.dtype)


def _output_is_forward(node) -> bool:
    """Whether a cotangent op's `o` is the forward node of its q, k, v and attributes (else
    an op written by hand)."""
    q, k, v, o, _ = node.inputs
    return o.op == "attention_core" and o.inputs == (q, k, v) and o.attrs == node.attrs


def _log_sum_exp(lowerer, node) -> str:
    """The forward's log-sum-exp buffer for a cotangent op `node`, computing it when the
    forward node did not."""
    o = node.inputs[3]
    key = lowerer.shared.get(("attention lse", o)) if _output_is_forward(node) else None
    if key is None:
        key = lowerer.new_buffer("f32", o.shape[:-1])
        _forward_launch(lowerer, node, (lowerer.new_buffer(o.dtype, o.shape), contiguous(o.shape)), key)
    return key


def _row_delta(lowerer, o, g) -> str:
    """D = rowsum(g * o), once for both cotangent ops of one output and cotangent."""
    from sexpgpu.backends.cuda.codegen.attention import run_row_delta

    key = lowerer.shared.get(("attention delta", o, g))
    if key is not None:
        return key
    key = lowerer.new_buffer("f32", o.shape[:-1])
    operands = lowerer.operands((o, g))

    def run(env):
        run_row_delta(*_tensors(env, operands), env[key])

    lowerer.launches.append(TorchLaunch(run, reads_of(operands), (key,), "attention"))
    lowerer.shared[("attention delta", o, g)] = key
    return key


def _score_delta(lowerer, node, lse: str) -> str:
    """D = rowsum(P * dP) from the products the float32 backward kernels form, once for both
    cotangent ops of one forward and cotangent. rowsum(dO * O) is the same value in exact
    arithmetic, but O carries the forward's 3xTF32 error: a one-hot row's dS = P (dP - D),
    exactly zero in the interpreter, would keep about 2^-22 of |dO| |O| (docs/cuda.md, "Attention")."""
    from sexpgpu.backends.cuda.codegen.attention import run_score_delta

    key = lowerer.shared.get(("attention score delta", node.inputs[3], node.inputs[4]))
    if key is not None:
        return key
    key = lowerer.new_buffer("f32", node.inputs[3].shape[:-1])
    operands = lowerer.operands(node.inputs[:3] + node.inputs[4:])
    scale, causal = node.attrs["scale"], node.attrs["causal"]

    def run(env):
        run_score_delta(*_tensors(env, operands), env[lse], env[key], scale, causal)

    lowerer.launches.append(TorchLaunch(run, reads_of(operands, lse), (key,), "attention"))
    lowerer.shared[("attention score delta", node.inputs[3], node.inputs[4])] = key
    return key


def _cotangent_launch(lowerer, node, kernel, results: list, scratch: tuple = ()) -> None:
    """A launch running `kernel(q, k, v, g, lse, delta, *results, scale, causal, *scratch)`,
    each result a (buffer, view) the kernel writes through, each scratch a buffer it writes.
    Heads too wide for the fused kernels, with the forward's own output, get delta None:
    attention_wide.py forms D from the probabilities it holds."""
    from sexpgpu.backends.cuda.codegen.attention import delta_from_products, fused

    q, v = node.inputs[0], node.inputs[2]
    lse = _log_sum_exp(lowerer, node)
    own_delta = not fused(q.shape[-1], v.shape[-1], q.dtype == "bf16") and _output_is_forward(node)
    if own_delta:
        delta = None
    elif delta_from_products(q.dtype == "bf16") and _output_is_forward(node):
        delta = _score_delta(lowerer, node, lse)
    else:
        delta = _row_delta(lowerer, node.inputs[3], node.inputs[4])
    operands = lowerer.operands(node.inputs[:3] + node.inputs[4:])
    scale, causal = node.attrs["scale"], node.attrs["causal"]

    def run(env):
        q, k, v, g = _tensors(env, operands)
        kernel(q, k, v, g, env[lse], None if delta is None else env[delta], *_written(env, results), scale, causal,
               *[env[key] for key in scratch])

    writes = tuple(dict.fromkeys([key for key, _ in results] + list(scratch)))
    statistics = (lse,) if delta is None else (lse, delta)
    lowerer.launches.append(TorchLaunch(run, reads_of(operands, *statistics), writes, "attention"))


@ATTENTION.rule("attention_grad_q")
def attention_grad_q(lowerer, node) -> None:
    from sexpgpu.backends.cuda.codegen.attention import run_backward_q

    if _paired(lowerer, node, "attention_grad_kv"):
        return
    result = _result(lowerer, node)
    _cotangent_launch(lowerer, node, run_backward_q, [result])
    lowerer.values[node] = load(*result, node.dtype)


def _kv_slices(lowerer, node) -> tuple | None:
    """The gradient rule's slices of `node`, dk then dv, when they are all that reads it."""
    width, axis = node.inputs[1].shape[-1], node.rank - 1
    halves = {(0, width): 0, (width, node.shape[-1]): 1}
    found = [None, None]
    for reader in lowerer.readers.consumers[node]:
        along = reader.op == "slice" and reader.attrs["axis"] % node.rank == axis
        at = halves.get((reader.attrs["start"], reader.attrs["stop"])) if along else None
        if at is None or found[at] is not None:
            return None
        found[at] = reader
    if None in found or node in lowerer.readers.outputs:
        return None
    return tuple(found)


def _kv_results(lowerer, node) -> list:
    """Where dk and dv are written: a buffer each, the gradient rule's slices' values, when
    the slices are all that reads `node`; else the two halves of one buffer, `node`'s value."""
    slices = _kv_slices(lowerer, node)
    if slices is not None:
        results = [_result(lowerer, part) for part in slices]
        for part, result in zip(slices, results):
            lowerer.values[part] = load(*result, part.dtype)
        return results
    key, width = lowerer.result_buffer(node), node.inputs[1].shape[-1]
    whole = contiguous(node.shape)
    lowerer.values[node] = load(key, whole, node.dtype)
    halves = [View(node.inputs[1].shape, whole.strides), View(node.inputs[2].shape, whole.strides, width)]
    return [(key, half) for half in halves]


@ATTENTION.rule("attention_grad_kv")
def attention_grad_kv(lowerer, node) -> None:
    from sexpgpu.backends.cuda.codegen.attention import run_backward_kv

    if _paired(lowerer, node, "attention_grad_q"):
        return
    _cotangent_launch(lowerer, node, run_backward_kv, _kv_results(lowerer, node))


def _sibling(lowerer, node, op: str):
    """The graph's other cotangent op of the same operands and attributes, if any."""
    for reader in lowerer.readers.consumers[node.inputs[0]]:
        if reader.op == op and reader.inputs == node.inputs and reader.attrs == node.attrs:
            return reader
    return None


def _paired(lowerer, node, other: str) -> bool:
    """Whether `node` is lowered with its sibling through dS in memory: the dK/dV kernel
    stores dS, and dQ is one product of it (codegen/attention.py, ds_in_memory). The first
    of the pair met lowers both; the second finds itself done."""
    from sexpgpu.backends.cuda.codegen.attention import ds_in_memory, fused, run_backward_kv, run_backward_q_from_ds

    if lowerer.shared.get(("attention paired", node)):
        return True
    sibling = _sibling(lowerer, node, other)
    q, k, v = node.inputs[:3]
    lead, bf16 = prod(q.shape[:-2]), q.dtype == "bf16"
    if sibling is None or not fused(q.shape[-1], v.shape[-1], bf16) or not ds_in_memory(lead, q.shape[-2], k.shape[-2], bf16):
        return False
    q_node, kv_node = (node, sibling) if node.op == "attention_grad_q" else (sibling, node)
    ds = lowerer.new_buffer(q.dtype, (lead, q.shape[-2], k.shape[-2]))
    _cotangent_launch(lowerer, kv_node, run_backward_kv, _kv_results(lowerer, kv_node), scratch=(ds,))
    dq = _result(lowerer, q_node)
    key_operand = lowerer.addressable(k)
    scale, causal = node.attrs["scale"], node.attrs["causal"]

    def run(env):
        (keys,) = _tensors(env, [key_operand])
        (written,) = _written(env, [dq])
        run_backward_q_from_ds(env[ds], keys, written, scale, causal)

    lowerer.launches.append(TorchLaunch(run, reads_of([key_operand], ds), (dq[0],), "attention"))
    lowerer.values[q_node] = load(*dq, q_node.dtype)
    lowerer.shared[("attention paired", sibling)] = True
    return True
