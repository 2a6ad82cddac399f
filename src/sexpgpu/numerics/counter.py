"""The raw counter-based generator: Philox4x32-10 on arrays."""

import numpy as np

from sexpgpu.numerics import arrays, cpu


def _shapes(counter, key):
    if counter.ndim < 1 or counter.shape[-1] != 4 or key.ndim < 1 or key.shape[-1] != 2:
        raise ValueError("philox4x32 expects counters of shape (..., 4) and keys of shape "
                         f"(..., 2), got {tuple(counter.shape)} and {tuple(key.shape)}")
    try:
        return np.broadcast_shapes(tuple(counter.shape[:-1]), tuple(key.shape[:-1]))
    except ValueError:
        raise ValueError("philox4x32: the leading shapes of counter and key do not broadcast: "
                         f"{tuple(counter.shape[:-1])} and {tuple(key.shape[:-1])}") from None


def philox4x32(counter, key):
    """Random123's Philox4x32-10: uint32 counters (..., 4) and keys (..., 2) -> (..., 4).

    Leading shapes broadcast. numpy arrays and CPU tensors run on numpy; CUDA tensors
    (torch.uint32) run the same code compiled by Triton.
    """
    what = "sexpgpu.numerics.philox4x32"
    kind = arrays.kind(counter, what, "uint32")
    if arrays.kind(key, what, "uint32") != kind or (kind == "cuda" and key.device != counter.device):
        raise TypeError(f"{what}: counter and key must be the same kind of array on one device")
    lead = _shapes(counter, key)
    if kind == "cuda":
        from sexpgpu.numerics import cuda

        c = counter.detach().broadcast_to(lead + (4,)).reshape(-1, 4).view(arrays.torch_module().int32)
        k = key.detach().broadcast_to(lead + (2,)).reshape(-1, 2).view(arrays.torch_module().int32)
        out = cuda.philox(c.contiguous(), k.contiguous())
        return out.view(arrays.torch_module().uint32).reshape(lead + (4,))
    c = np.broadcast_to(arrays.as_numpy(counter), lead + (4,)).reshape(-1, 4)
    k = np.broadcast_to(arrays.as_numpy(key), lead + (2,)).reshape(-1, 2)
    out = cpu.philox4x32(np.ascontiguousarray(c), np.ascontiguousarray(k)).reshape(lead + (4,))
    return arrays.torch_module().from_numpy(out) if kind == "torch" else out
