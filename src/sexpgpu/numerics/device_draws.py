"""Draws a CUDA graph can capture: keys folded on the device, results written in place.

A captured graph replays the same kernels on the same memory, so a draw in it cannot take
its key from the host. `fold_keys` computes fold_in(key, salt) on the device, from salts
that live in device memory (a graph's step input, a value a kernel computed), into a tensor
of args words; `draw_into` draws under the keys it finds there into a given tensor. Neither
allocates, copies from the host or reads a value back, and both launch one kernel (a fold
of more than four salts, one more for every four). The bits are those of the draws of
sampling.py: the same Philox blocks and transforms (portable/), the same fold_in.

    spec = nx.draw_spec("normal", std=0.5)
    template = torch.tensor([nx.draw_args(key, spec)], device="cuda")     # made once
    args = torch.empty_like(template)
    nx.fold_keys(template, [step], args)    # step: a 0-d int32 tensor on the device
    nx.draw_into(spec, out, args)           # out: normal(fold_in(key, step), out.shape, std=0.5)

Tensors are on a CUDA device, or on the CPU while Triton's interpreter runs them
(TRITON_INTERPRET=1), which is how the kernels are checked without a GPU.
"""

from sexpgpu.numerics import arrays
from sexpgpu.numerics.keys import Key
from sexpgpu.numerics.sampling import DrawSpec

WHAT = "sexpgpu.numerics"
SALT_DTYPES = ("int32", "int64")


def draw_args(key, spec):
    """The int64 words a draw kernel reads: the key's two words, then the spec's."""
    if not isinstance(key, Key) or not isinstance(spec, DrawSpec):
        raise TypeError(f"{WHAT}.draw_args takes a Key and a DrawSpec (draw_spec), got "
                        f"{type(key).__name__} and {type(spec).__name__}")
    return key.words + tuple(spec.words)


def fold_keys(template, salts, out):
    """Row r of `out` (int64, (rows, words), C order): the one row of `template` (int64,
    (1, words), draw_args' words) with each salt folded into its key in order, as fold_in
    folds it: a 0-d salt into every row's key, element r of a vector salt (rows,) into row
    r's. Salts are int32 or int64 tensors, signed; any strides."""
    what = f"{WHAT}.fold_keys"
    device = _device(out, what)
    rows, words = _args_shape(out, what)
    if _device(template, what) != device or template.dtype != out.dtype or tuple(template.shape) != (1, words):
        raise ValueError(f"{what}: template must be int64 of shape (1, {words}) on {device}, got "
                         f"{template.dtype} {tuple(template.shape)} on {template.device}")
    for salt in salts:
        if _device(salt, what) != device or str(salt.dtype).removeprefix("torch.") not in SALT_DTYPES \
                or tuple(salt.shape) not in ((), (rows,)):
            raise ValueError(f"{what}: a salt is an int32 or int64 tensor of shape () or ({rows},) on "
                             f"{device}, got {salt.dtype} {tuple(salt.shape)} on {salt.device}")
    from sexpgpu.numerics import cuda

    cuda.fold_keys(template, list(salts), out)


def draw_into(spec, out, args, rows=1, copies=1):
    """The draw `spec` written into `out` (C order, the spec's dtype), rows of n = out.numel()
    / (rows copies) elements in order, each row written `copies` times one after the other:
    row r is the draw of n elements under args row r (int64, (rows, len(draw_args))). So
    rows=1, copies=1 is the draw of out's shape; copies=k repeats one draw k times; rows=B
    draws each of B rows under a key of its own (fold_keys with a vector salt)."""
    what = f"{WHAT}.draw_into"
    if not isinstance(spec, DrawSpec):
        raise TypeError(f"{what}: spec must be a DrawSpec (draw_spec), got {type(spec).__name__}")
    device = _device(out, what)
    from sexpgpu.numerics import cuda

    want = getattr(arrays.torch_module(), cuda.TORCH_DTYPES[spec.dtype])
    if out.dtype != want or not out.is_contiguous():
        raise ValueError(f"{what}: out must be a C-ordered {want} tensor, got {out.dtype}")
    if rows < 1 or copies < 1 or out.numel() % (rows * copies):
        raise ValueError(f"{what}: {out.numel()} elements are not {rows} rows of {copies} copies")
    if _device(args, what) != device or _args_shape(args, what) != (rows, 2 + len(spec.words)):
        raise ValueError(f"{what}: args must be int64 of shape ({rows}, {2 + len(spec.words)}) on "
                         f"{device}, got {tuple(args.shape)} on {args.device}")
    cuda.draw_into(spec, out, args, rows, copies)


def _device(tensor, what):
    """A tensor's device, where the kernels can run on it."""
    if not arrays.is_torch(tensor):
        raise TypeError(f"{what} takes torch tensors, got {type(tensor).__name__}")
    if tensor.device.type == "cuda":
        return tensor.device
    from sexpgpu.numerics import cuda

    if tensor.device.type == "cpu" and cuda.interpreting():
        return tensor.device
    raise ValueError(f"{what} runs on CUDA tensors (CPU tensors only under TRITON_INTERPRET=1), "
                     f"got one on {tensor.device}")


def _args_shape(args, what):
    torch = arrays.torch_module()
    if args.dtype != torch.int64 or args.dim() != 2 or not args.is_contiguous():
        raise ValueError(f"{what}: args words are a C-ordered int64 (rows, words) tensor, got "
                         f"{args.dtype} {tuple(args.shape)}")
    return tuple(args.shape)
