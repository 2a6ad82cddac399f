"""The gradient of a gather (an embedding's table): rows of values summed into the rows
their ids name, with no atomics.

The ids are sorted stably, so each table row's contributions are a run of positions in
increasing order; one program per (table row, block of columns) folds its run from +0 in
that order, exactly the CPU interpreter's `np.add.at` order. Rows no id names get +0.
"""

import triton
import triton.language as tl

from sexpgpu.backends.cuda.codegen.bits import load_bf16, store_bf16
from sexpgpu.backends.cuda.codegen.space import power_of_two_block

# Columns of a table row one program folds: a row of up to MAX_BLOCK columns is one program,
# so a vocabulary of 50304 rows, most of which no id names and which only store +0, is 50304
# programs rather than 50304 per 128 columns. Each element's fold is the same at any width.
MAX_BLOCK = 1024


def block_for(width: int) -> int:
    return power_of_two_block(width, 16, MAX_BLOCK)


@triton.jit
def scatter_rows(order, starts, values, out, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
                 IN_BF16: tl.constexpr, OUT_BF16: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    position = tl.load(starts + row)
    stop = tl.load(starts + row + 1)
    acc = tl.full([BLOCK], 0.0, tl.float32)
    while position < stop:  # a while loop: Triton's interpreter cannot range over loaded bounds
        source = tl.load(order + position)
        value = tl.load(values + source * WIDTH + cols, mask=mask, other=0)
        if IN_BF16:
            value = load_bf16(value)
        acc += value
        position += 1
    if OUT_BF16:
        tl.store(out + row * WIDTH + cols, store_bf16(acc), mask=mask)
    else:
        tl.store(out + row * WIDTH + cols, acc, mask=mask)


def scatter_add(ids, values, out) -> None:
    """out[r] = fold over positions p with ids[p] == r, in increasing p, of values[p]."""
    import torch

    rows = out.shape[0]
    width = out[0].numel() if rows else 0
    flat = ids.reshape(-1).to(torch.int64)
    ordered, order = torch.sort(flat, stable=True)
    starts = torch.searchsorted(ordered, torch.arange(rows + 1, device=ids.device, dtype=torch.int64))
    block = block_for(width)
    grid = (rows, max(1, -(-width // block)))
    scatter_rows[grid](order, starts, values.reshape(-1), out, width, block,
                       values.dtype == torch.bfloat16, out.dtype == torch.bfloat16, enable_fp_fusion=False)
