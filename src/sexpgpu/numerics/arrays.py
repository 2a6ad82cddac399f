"""Recognising the arrays the public functions accept, and making their results."""

import numpy as np


def torch_module():
    import torch

    return torch


def is_torch(x):
    return type(x).__module__.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter")


def kind(x, what, dtype_name="float32"):
    """'numpy', 'torch' (CPU) or 'cuda' for an accepted array; TypeError otherwise."""
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        if x.dtype != np.dtype(dtype_name):
            raise TypeError(f"{what} expects {dtype_name}, got a numpy array of {x.dtype}; "
                            f"convert explicitly, e.g. x.astype(np.{dtype_name})")
        return "numpy"
    if is_torch(x):
        torch = torch_module()
        if x.dtype != getattr(torch, dtype_name):
            raise TypeError(f"{what} expects torch.{dtype_name}, got {x.dtype}; "
                            f"convert explicitly, e.g. x.to(torch.{dtype_name})")
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{what} runs on CPU and CUDA tensors, got one on {x.device}")
        return "cuda" if x.device.type == "cuda" else "torch"
    raise TypeError(f"{what} expects a {dtype_name} numpy array or torch tensor, "
                    f"got {type(x).__name__}")


def as_numpy(x):
    """The values of a numpy array or CPU tensor as a C-ordered numpy array."""
    if is_torch(x):
        x = x.detach().numpy()
    return np.asarray(x, order="C")


def like(result, original):
    """result (numpy) in the form of `original`: a numpy scalar, array or CPU tensor."""
    if is_torch(original):
        return torch_module().from_numpy(result)
    if isinstance(original, np.generic):
        return result[()]
    return result


def resolve_device(device, what):
    """None (numpy), or a torch.device of type cpu or cuda."""
    if device is None:
        return None
    torch = torch_module()
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{what}: device must be None, a str or a torch.device, "
                        f"got {type(device).__name__}")
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what}: device must be cpu or cuda, got {device}")
    return device
