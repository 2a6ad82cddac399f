"""The queued path: det_gemm's, det_gemm_batched's and det_sum's rounding with every decision on the device.

    y = queued_product(x, w)     # x @ w.T (of each matrix), float32, for x (M, K) or (B, M, K)
    s = queued_sum(rows)         # each row's exact sum, float32, for rows (P, K) of any strides

The host path (bounded_gemm.py, batched.py) reads counts back to size its lists: how many outputs
the float64 product left, how many the pair sums left. On a GPU each read waits for every
kernel queued before it. Here no count leaves the device, so a call queues its kernels and
returns, whatever its data:

1. for one matrix on a GPU with int8 tensor cores, the residue stage (residue_stage.py: no
   output of a row holding a NaN or an infinity settles there); else the operands widened to
   float64 (float64_stage.widened: contiguous rows, a row holding a non-finite element with an
   infinite or NaN norm bound), their float64 product in chunks of K
   (float64_stage.float64_total), settled in one pass (settle_kernel); a sum
   instead bounds each row's float64 sum by its own magnitudes (`_row_sums`), tighter than
   the Cauchy-Schwarz bound of a product with ones;
2. the outputs left, listed on the device (`_list_pending`, at places an atomic count hands
   out) in a list as long as the outputs, since nothing on the host knows how many there
   are: a bound cannot be too small, so no data can overflow it;
3. each listed output's compensated dot product (`_pair_refine`, pair_sums.py's bound) by a
   fixed grid of programs that walk the list up to the count in device memory; NaN and
   infinite products are classified there (a row holding one has an infinite or NaN norm, so
   its outputs always reach this stage) and take the special rule;
4. the outputs still left (a second list, which stage 3 fills by atomics) computed exactly
   (`_exact_refine`): Kulisch digits in lanes along K, carried and rounded in the kernel.

Each output is its exact sum's rounding on every path, so the bits are the host path's; only
the time depends on the data. Unlike the host path there are no tiers on a block (choosing
them needs the count): data whose outputs the bounds mostly leave (a row spanning the whole
exponent range, sums that cancel to far below their terms) take stage 4 output by output,
correct and slower. Results are float32; bfloat16 results take the host path.
"""

from __future__ import annotations

import torch

from . import implementations, residue_stage
from .float64_stage import SLACK, UNIT, chunk_for, float64_total, gamma, product_factor, tile_width, upward_float32, widened
from .layout import MAX_K_PER_CALL
from .paths import forced_path

# a refine kernel's fixed grid: its programs walk the list in turn, so the grid decides only
# the time. Under Triton's interpreter every program runs in Python, even one whose list is
# empty (most outputs settle before the list): there two programs walk it.
REFINE_PROGRAMS = {"compiled": 4096, "interpreted": 2}
REFINE_BLOCK = 16  # listed outputs a program takes at once (105 registers at 32 lanes: four programs an SM)
LANES = 32  # _pair_refine's lanes along K
LONG_K = 4096  # from this K on, a pair refine program takes LONG_SHAPE: few outputs of a long K
# (a weight's gradient over the tokens) would otherwise keep a few programs walking K in turn
LONG_SHAPE = (4, 128)  # (outputs, lanes) of a program
EXACT_SHAPE = (2, 64)  # (outputs, lanes) of an _exact_refine program: one output of K = 24576
# walked in one lane took 7.6 ms on an H200
LIST_BLOCK = 1024  # outputs a listing program reads
SEGMENT = 1 << 16  # columns of a row one _row_sums program sums at most; longer rows are cut into segments
SUM_PROGRAMS = 512  # ... and rows are cut until about this many programs run
TILE = 2048  # elements of a _row_sums program's tile
ROW_LANES = 128  # ... its lanes along contiguous rows, each adding its columns in turn (the join counts them all)


def applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a rounding on `device` into `dtype` takes this path: float32 results on the
    device paths (implementations.on_device), unless an implementation or a tier path is forced."""
    return implementations.on_device(device) and dtype == torch.float32 and not implementations.forcing() and forced_path() is None


def queued_product(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T for x (M, K) and w (N, K), or of each matrix for x (B, M, K) and w (B, N, K):
    each output's exact sum rounded once to float32, no count read back. out: a contiguous
    float32 tensor of as many elements, sharing no memory with x or w, to write the result
    into (a caller's buffer, which then needs no copy), or None."""
    from .settle_kernel import settle_float32  # Triton is imported only where it runs

    batched = x.dim() == 3
    if not batched and residue_stage.applies(x, w, torch.float32):
        return _by_residues(x, w, out)
    x3, w3 = (x, w) if batched else (x[None], w[None])
    x3, w3 = _float(x3), _float(w3)
    batch, m, k = x3.shape
    n = w3.shape[1]
    x64, x_norm = widened(x3)  # a batch of transposed matrices is read as it lies, not copied first
    w64, w_norm = widened(w3)
    chunk = chunk_for(m * n, k, batched)
    total = float64_total(x64.view(batch, m, k), w64.view(batch, n, k), chunk) if batched else \
        float64_total(x64, w64, chunk)
    into = None if out is None else out.view(total.shape)
    done, result = settle_float32(total, x_norm.view(batch, m) if batched else x_norm,
                                  w_norm.view(batch, n) if batched else w_norm, product_factor(k, chunk), into)
    del total
    _refine(_along_rows(x3, x64), _along_rows(w3, w64), x_norm, w_norm, result, done.view(torch.int8), m, n,
            ones=False)
    return result


def _by_residues(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """queued_product with the residue stage first (residue_stage.py): operands whose rows are
    not contiguous are copied first, since both the residues and the refine kernels walk rows."""
    x, w = residue_stage.along_rows(x), residue_stage.along_rows(w)
    settled = residue_stage.residue_product(x, w, out)  # bf16 operands take fewer moduli
    x, w = _float(x), _float(w)
    _refine(x, w, settled.x_norm, settled.w_norm, settled.result, settled.done.view(torch.int8), x.shape[0],
            w.shape[0], ones=False)
    return settled.result


def _along_rows(matrices: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
    """What the refine kernels read of an operand (B, R, K), as rows (B * R, K): its rows as
    given where they are contiguous and the matrices' rows one run of equal strides (half the
    bytes), else its float64 copy, whose rows are (a transposed operand's elements along K lie
    a row apart, and a kernel walking K would read a sector for each)."""
    b, r, _ = matrices.shape
    one_run = b == 1 or matrices.stride(0) == r * matrices.stride(1)
    return matrices.view(b * r, matrices.shape[2]) if matrices.stride(2) == 1 and one_run else wide


def queued_sum(rows: torch.Tensor) -> torch.Tensor:
    """The exact sum of each row of rows (P, K), rounded once to float32, no count read back."""
    from . import queued_kernels as kernels

    rows = _float(rows)
    p, k = rows.shape
    result = torch.empty(p, dtype=torch.float32, device=rows.device)
    done = torch.empty(p, dtype=torch.int8, device=rows.device)
    magnitude = torch.empty(p, dtype=torch.float64, device=rows.device)
    if p == 0:
        return result
    block_r, block_k = _sum_tile(rows)
    segment = _sum_segment(p, k, block_r, block_k)
    segments = max(-(-k // segment), 1)
    # each term passes through its lane's additions, the lanes' join (any order) and the segments' sum
    additions = -(-min(k, segment) // block_k) + (block_k - 1) + segments
    bound_factor = upward_float32(gamma(additions) / (1 - gamma(additions)) * SLACK)
    magnitude_factor = upward_float32(SLACK / (1 - gamma(additions)))
    grid = (-(-p // block_r), segments)
    if segments == 1:
        kernels._row_sums[grid](rows, result, result, result, done, magnitude, p, k, rows.stride(0), rows.stride(1),
                                segment, bound_factor, magnitude_factor, SETTLE=True, BLOCK_R=block_r,
                                BLOCK_K=block_k, num_warps=4, enable_fp_fusion=False)
    else:
        sums = torch.empty((p, segments), dtype=torch.float64, device=rows.device)
        magnitudes = torch.empty_like(sums)
        kernels._row_sums[grid](rows, sums, magnitudes, result, done, magnitude, p, k, rows.stride(0),
                                rows.stride(1), segment, bound_factor, magnitude_factor, SETTLE=False,
                                BLOCK_R=block_r, BLOCK_K=block_k, num_warps=4, enable_fp_fusion=False)
        kernels._segment_sums[(-(-p // 256),)](sums, magnitudes, result, done, magnitude, p, segments,
                                               bound_factor, magnitude_factor, BLOCK_R=256, num_warps=4,
                                               enable_fp_fusion=False)
    ones_norm = torch.ones(1, dtype=torch.float64, device=rows.device)  # |1| for every term's other factor
    _refine(rows, rows, magnitude, ones_norm, result, done, p, 1, ones=True)
    return result


def _float(t: torch.Tensor) -> torch.Tensor:
    """bfloat16 widened to float32, which is exact (the kernels read float32)."""
    return t.float() if t.dtype == torch.bfloat16 else t


def _sum_segment(p: int, k: int, block_r: int, block_k: int) -> int:
    """The columns one _row_sums program sums: at most SEGMENT, and few enough that about
    SUM_PROGRAMS programs run (a few long rows, a sum over the tokens, would leave most of the
    GPU idle); a whole number of tiles."""
    blocks = max(-(-p // block_r), 1)
    steps = max(-(-k // block_k), 1)
    segments = max(-(-k // SEGMENT), min(max(SUM_PROGRAMS // blocks, 1), steps))
    return -(-steps // segments) * block_k


def _sum_tile(rows: torch.Tensor) -> tuple:
    """(BLOCK_R, BLOCK_K) of _row_sums for this layout: rows along K when they are contiguous
    there, many rows a column when the rows are adjacent (a sum over the batch axis)."""
    k = rows.shape[1]
    if rows.stride(1) != 1 and rows.stride(0) == 1:
        return 64, 32
    block_k = min(ROW_LANES, tile_width(k))
    return TILE // block_k, block_k


def _refine(x, w, x_norm, w_norm, result, done, m: int, n: int, ones: bool) -> None:
    """Stages 2 to 4 of the module's docstring, on the outputs `done` (int8, 0 pending) leaves;
    writes their values into `result`. Output b*m*n + i*n + j is row b*m + i of x times row
    b*n + j of w (row 0 of a row of ones, for a sum)."""
    from . import queued_kernels as kernels

    outputs = result.numel()
    if outputs == 0:
        return
    flat_result, flat_done = result.view(-1), done.view(-1)
    k = x.shape[1]
    block_p, lanes = refine_shape(k)
    terms = pair_terms(k, lanes)
    unit_factor = upward_float32(UNIT * SLACK)
    terms_factor = upward_float32(gamma(terms) * terms * UNIT * SLACK)
    programs = REFINE_PROGRAMS[implementations.launch_kind(x.device)]
    grid = (min(-(-outputs // block_p), programs),)
    strides = (x.stride(0), x.stride(1), w.stride(0), w.stride(1))
    counts = torch.zeros(2, dtype=torch.int64, device=flat_done.device)  # the two lists' lengths: one fill
    listed, count = _pending_list(flat_done, counts)
    left, left_count = torch.empty_like(listed), counts[1:]
    kernels._pair_refine[grid](x, w, x_norm, w_norm, listed, count, flat_result, flat_done, left, left_count, m, n, k,
                               *strides, unit_factor, terms_factor, ONES=ones, BLOCK_P=block_p, BLOCK_K=lanes,
                               num_warps=4, enable_fp_fusion=False)
    del listed
    exact_p, exact_lanes = EXACT_SHAPE
    exact_grid = (min(-(-outputs // exact_p), programs),)
    kernels._exact_refine[exact_grid](x, w, left, left_count, flat_result, m, n, k, *strides, ONES=ones,
                                      BLOCK_P=exact_p, BLOCK_K=exact_lanes, FLUSH=MAX_K_PER_CALL, num_warps=4)


def refine_shape(k: int) -> tuple:
    """(outputs, lanes along K) of a _pair_refine program for K columns."""
    return LONG_SHAPE if k >= LONG_K else (REFINE_BLOCK, LANES)


def pair_terms(k: int, lanes: int = LANES) -> int:
    """pair_sums' n for _pair_refine over K columns in `lanes` lanes: the lanes' error terms and
    additions, then the join's lanes - 1 errors and, in a tree of any shape, up to
    2 (lanes - 1) additions on an error's path."""
    steps = -(-k // lanes)
    return (lanes + 1) * steps + lanes + 2 * (lanes - 1)


def _pending_list(done: torch.Tensor, counts: torch.Tensor | None = None) -> tuple:
    """(int64 list of the pending outputs' indices, in no particular order, its count as a
    1-element device tensor). The list has room for every output. counts: zeroed int64 device
    memory whose first element takes the count, or None."""
    from . import queued_kernels as kernels

    outputs = done.numel()
    counts = torch.zeros(1, dtype=torch.int64, device=done.device) if counts is None else counts
    listed = torch.empty(outputs, dtype=torch.int64, device=done.device)
    kernels._list_pending[(-(-outputs // LIST_BLOCK),)](done, counts, listed, outputs, BLOCK=LIST_BLOCK, num_warps=4)
    return listed, counts[:1]
