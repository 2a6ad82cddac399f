"""The attention ops as steps running the fused kernels of codegen/attention.py.

- attention_core: one forward kernel writes the output and each query's log-sum-exp (kept
  beside the node in `Lowerer.shared`, for the backward);
- attention_grad_q and attention_grad_kv: D = rowsum(g * o) is computed once for the pair
  (a step of its own, shared through `Lowerer.shared`), then one kernel each. When `o` is not
  the forward node of the same q, k, v and attributes (an op written by hand), the
  log-sum-exp is computed by a forward kernel into scratch first. The statistics are
  float32 buffers of the output's shape less its last axis, read by flat position.

q, k and v are read through the views the lowering already has (the heads split off by a
transpose view of the projections' buffer); a view whose leading axes do not fold into
(lead, heads) is copied. Results are written into their contiguous buffers;
attention_grad_kv's buffer holds dk then dv along the last axis, and the gradient rule's
slices read them as views.
"""

from __future__ import annotations

from sexpgpu.backends.cuda.steps import TorchStep, strided


def _four_axes(tensor):
    """(..., T, E) as (lead, heads, T, E): a view when the leading axes fold, else a copy."""
    lead = tuple(tensor.shape[:-2])
    heads = lead[-1] if lead else 1
    return tensor.reshape((-1, heads) + tuple(tensor.shape[-2:]))


def _operands(lowerer, nodes) -> list:
    return [lowerer.addressable(node) for node in nodes]


def _tensors(env, operands) -> list:
    return [_four_axes(strided(env, key, view)) for key, view in operands]


def _reads(operands, *more) -> tuple:
    return tuple(dict.fromkeys([key for key, _ in operands] + list(more)))


def _forward_step(lowerer, node, out: str, lse: str) -> None:
    from sexpgpu.backends.cuda.codegen.attention import run_forward

    operands = _operands(lowerer, node.inputs[:3])
    scale, causal = node.attrs["scale"], node.attrs["causal"]

    def run(env):
        q, k, v = _tensors(env, operands)
        run_forward(q, k, v, _four_axes(env[out]), env[lse], scale, causal)

    lowerer.steps.append(TorchStep(run, _reads(operands), (out, lse), "attention"))


def attention_core(lowerer, node) -> None:
    out = lowerer.result_buffer(node)
    lse = lowerer.new_buffer("f32", node.shape[:-1])
    _forward_step(lowerer, node, out, lse)
    lowerer.shared[("attention lse", node)] = lse
    lowerer.values[node] = lowerer.loaded(node, out)


def _log_sum_exp(lowerer, node) -> str:
    """The forward's log-sum-exp buffer for a cotangent op `node`, computing it when the
    forward node did not."""
    q, k, v, o, _ = node.inputs
    forward = o.op == "attention_core" and o.inputs == (q, k, v) and o.attrs == node.attrs
    key = lowerer.shared.get(("attention lse", o)) if forward else None
    if key is None:
        key = lowerer.new_buffer("f32", o.shape[:-1])
        _forward_step(lowerer, node, lowerer.new_buffer(o.dtype, o.shape), key)
    return key


def _row_delta(lowerer, o, g) -> str:
    """D = rowsum(g * o), once for both cotangent ops of one output and cotangent."""
    from sexpgpu.backends.cuda.codegen.attention import run_row_delta

    key = lowerer.shared.get(("attention delta", o, g))
    if key is not None:
        return key
    key = lowerer.new_buffer("f32", o.shape[:-1])
    operands = _operands(lowerer, (o, g))

    def run(env):
        run_row_delta(*_tensors(env, operands), env[key])

    lowerer.steps.append(TorchStep(run, _reads(operands), (key,), "attention"))
    lowerer.shared[("attention delta", o, g)] = key
    return key


def _cotangent_step(lowerer, node, launch) -> None:
    """A step running `launch(q, k, v, g, lse, delta, result, scale, causal)`."""
    lse = _log_sum_exp(lowerer, node)
    delta = _row_delta(lowerer, node.inputs[3], node.inputs[4])
    operands = _operands(lowerer, node.inputs[:3] + node.inputs[4:])
    key = lowerer.result_buffer(node)
    scale, causal = node.attrs["scale"], node.attrs["causal"]

    def run(env):
        q, k, v, g = _tensors(env, operands)
        launch(q, k, v, g, env[lse], env[delta], _four_axes(env[key]), scale, causal)

    lowerer.steps.append(TorchStep(run, _reads(operands, lse, delta), (key,), "attention"))
    lowerer.values[node] = lowerer.loaded(node, key)


def attention_grad_q(lowerer, node) -> None:
    from sexpgpu.backends.cuda.codegen.attention import run_backward_q

    _cotangent_step(lowerer, node, run_backward_q)


def attention_grad_kv(lowerer, node) -> None:
    from sexpgpu.backends.cuda.codegen.attention import run_backward_kv

    width = node.inputs[1].shape[-1]

    def launch(q, k, v, g, lse, delta, result, scale, causal):
        run_backward_kv(q, k, v, g, lse, delta, result[..., :width], result[..., width:], scale, causal)

    _cotangent_step(lowerer, node, launch)


ATTENTION = {
    "attention_core": attention_core,
    "attention_grad_q": attention_grad_q,
    "attention_grad_kv": attention_grad_kv,
}
