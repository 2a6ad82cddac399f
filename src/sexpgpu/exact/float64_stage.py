"""det_gemm's first stage: x @ w.T in float64, rounded wherever a bound for any summation order proves it.

A bf16 or f32 value is exact in float64, and so is the product of two: at most 48 significant
bits, of weight between 2**-298 and 2**256, inside float64's normal range. A float64 matrix
product of such operands therefore errs only in its additions. In whatever order or tree a
BLAS library adds, with or without fused multiply-adds, on scalar or tensor cores, an output
whose products each pass through at most D additions errs by at most

    gamma(D) * sum_k |x[m, k] * w[n, k]|,      gamma(D) = D u / (1 - D u),               (1)

where u = 2**-52 is twice float64's unit roundoff, so that faithful additions are covered as
well as correctly rounded ones. K is cut into chunks of CHUNK columns, each chunk's product
added into the result in turn (addmm), so no product passes through more than
CHUNK + chunks + 1 additions, however the library splits a chunk. By Cauchy-Schwarz the sum
in (1) is at most ||x[m]|| ||w[n]||: two vectors instead of a second matrix product. The
norms are float64 sums of exact squares, raised to cover their own rounding (a sum of K
non-negative terms errs by at most gamma(K) of itself), and a factor 1 + 2**-40 covers the
rounding of the bound's few operations.

An output is settled when every real within the bound of the float64 result rounds to one
value (bounded_gemm.settle): that value is then the exact sum's rounding, whatever the library
did. The outputs left over are near zero (their float32 cell is narrower than the bound),
next to a rounding boundary, or the result of cancellation; pair_sums.py refines them.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch

from . import implementations

CHUNK = 1024  # columns of K a float64 product sums before the next is added: the bound's depth
UNIT = 2.0**-52  # twice float64's unit roundoff
SLACK = 1 + 2.0**-40  # covers the rounding of the bound's own few float64 operations


def upward_float32(value: float) -> float:
    """The smallest float32 at or above a non-negative finite `value`, as a Python float: a
    factor a Triton kernel reads as the same number compiled (float32 arguments) and
    interpreted (float64), and that is never below the bound it stands for."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))  # to nearest
    (nearest,) = struct.unpack("<f", struct.pack("<I", bits))
    if nearest >= value:
        return nearest
    (above,) = struct.unpack("<f", struct.pack("<I", bits + 1))
    return above


def gamma(additions: int) -> float:
    """gamma(D) of inequality (1): the relative error of D additions, for D u < 1/2."""
    return additions * UNIT / (1 - additions * UNIT)


@dataclass
class Float64Product:
    """The stage's float64 results for all of x @ w.T (of each matrix, for a batch), and what
    later stages reuse."""

    total: torch.Tensor  # float64 (M, N), or (B, M, N): within bound() of the exact sum
    x_norm: torch.Tensor  # float64 (M,) or (B, M): at least ||x[m]||_2
    w_norm: torch.Tensor  # float64 (N,) or (B, N)
    factor: float  # gamma(D) * SLACK, rounded up to a float32 (upward_float32)

    def bound(self) -> torch.Tensor:
        """(x_norm[m] * w_norm[n]) * factor, float64 (M, N) or (B, M, N): inequality (1)."""
        if self.x_norm.dim() == 1:
            return torch.outer(self.x_norm, self.w_norm).mul_(self.factor)
        return (self.x_norm[:, :, None] * self.w_norm[:, None, :]).mul_(self.factor)


def float64_product(x: torch.Tensor, w: torch.Tensor, chunk: int | None = None) -> Float64Product:
    """x @ w.T in float64 for finite bf16 or f32 x (M, K) and w (N, K), with its error bound;
    for x (B, M, K) and w (B, N, K), each matrix's product and bound. chunk: chunk_for's by default."""
    chunk = chunk_for(x.shape[-2] * w.shape[-2], x.shape[-1], x.dim() == 3) if chunk is None else chunk
    (x64, x_norm), (w64, w_norm) = _widened_matrices(x), _widened_matrices(w)
    total = float64_total(x64, w64, chunk)
    return Float64Product(total, x_norm, w_norm, product_factor(x.shape[-1], chunk))


def _widened_matrices(t: torch.Tensor) -> tuple:
    """widened on the rows of t (..., K), reshaped back: (float64 t, norms (...))."""
    wide, norm = widened(t[None] if t.dim() == 1 else t if t.dim() <= 3 else t.reshape(-1, *t.shape[-2:]))
    return wide.view(t.shape), norm.view(t.shape[:-1])


TILE = 2048  # elements of a widening program's tile
ROW_COLUMNS = 128  # its columns for contiguous rows; a transposed operand takes 32
WIDEN_PROGRAMS = 512  # rows are cut into segments of K until about this many programs run


def widened(rows: torch.Tensor) -> tuple:
    """(the rows of rows (R, K) or of each matrix of rows (B, R, K), of any strides, in float64,
    contiguous (B * R, K); an upper bound of each row's Euclidean norm (B * R,), infinite or NaN
    for a row holding a non-finite element, which stays). On the device paths one pass
    (widen_kernel.py) that reads the strides as they are (a batch of transposed matrices,
    an attention's P.T, is not copied first), else a conversion and upper_norms."""
    k = rows.shape[-1]
    if not implementations.on_device(rows.device):
        wide = rows.to(torch.float64, memory_format=torch.contiguous_format).reshape(math.prod(rows.shape[:-1]), k)
        return wide, upper_norms(wide)
    from .widen_kernel import widen  # Triton is imported only where it runs

    rows = rows.float() if rows.dtype == torch.bfloat16 else rows  # exact; the kernel reads float32
    r = math.prod(rows.shape[:-1])
    # a transposed operand (a weight read as w.T, an activation's gradient in a weight's
    # product) takes a square tile, which Triton loads along one axis and stores along the other
    block_k = min(ROW_COLUMNS if rows.stride(-1) == 1 else 32, tile_width(k))
    block_r = TILE // block_k
    steps = max(-(-k // block_k), 1)
    segments = min(max(WIDEN_PROGRAMS // max(-(-r // block_r), 1), 1), steps)
    segment = -(-steps // segments) * block_k
    # each square passes through its lane's additions, the lanes' tree and the segments' sum
    additions = -(-segment // block_k) + block_k + -(-k // segment)
    raise_factor = upward_float32(max(1 + gamma(additions), SLACK))
    return widen(rows, block_r, block_k, segment, raise_factor)


def tile_width(count: int) -> int:
    """A tile's extent for `count` elements: the smallest power of two at least `count`, and at least 16."""
    return max(16, 1 << max(count - 1, 0).bit_length())


SPLIT_OUTPUTS = 1 << 22  # at most this many outputs take the chunks' products side by side
SPLIT_BYTES = 1 << 28  # ... whose float64 products take at most this much memory
SHORTEST_CHUNK = 64


def chunk_for(outputs: int, k: int, batched: bool = False) -> int:
    """The chunk of K for a product of `outputs` outputs (of each matrix, for a batch). Chunks
    in turn take CHUNK. Chunks side by side (`_split_total`) cost little more when there are
    more of them, so they take the chunk that makes D = chunk + chunks + 1 least, about
    sqrt(K), or the shortest whose products fit SPLIT_BYTES: at K = 16384 D falls from 1041 to
    257, and the share of outputs the bound leaves with it (a weight's gradient cancels)."""
    if batched or outputs > SPLIT_OUTPUTS or k < 2 * CHUNK:
        return CHUNK
    fitting = -(-k * outputs * 8 // SPLIT_BYTES)
    return min(max(math.isqrt(k), fitting, SHORTEST_CHUNK), CHUNK)


def float64_total(x64: torch.Tensor, w64: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """x64 @ w64.T (of each matrix, for a batch) in chunks of K: the first chunk's product,
    then each further chunk's added in turn (addmm), so no product passes through more than
    chunk + chunks additions however the library splits a chunk. A small output with a long
    K (a weight's gradient over every token) takes the chunks side by side instead (`_split_total`)."""
    k = x64.shape[-1]
    if x64.dim() == 2 and k >= 2 * chunk and x64.shape[0] * w64.shape[0] <= SPLIT_OUTPUTS:
        return _split_total(x64, w64, chunk)
    total = torch.matmul(x64[..., :chunk], w64[..., :chunk].transpose(-1, -2))
    add = torch.Tensor.addmm_ if x64.dim() == 2 else torch.Tensor.baddbmm_
    for k0 in range(chunk, k, chunk):
        add(total, x64[..., k0 : k0 + chunk], w64[..., k0 : k0 + chunk].transpose(-1, -2))
    return total


def _split_total(x64: torch.Tensor, w64: torch.Tensor, chunk: int) -> torch.Tensor:
    """float64_total for contiguous x64 (M, K) and w64 (N, K): the whole chunks' products as one
    batch, which fills the GPU where M x N alone would leave most of it idle, summed over the
    batch, then the last part chunk's product added. A product passes through at most chunk
    additions in its chunk's product, chunks - 1 in the sum over the batch (in any tree), and
    one for the part chunk: within float64_total's bound."""
    (m, k), n = x64.shape, w64.shape[0]
    whole = k // chunk
    if whole * chunk == k and x64.is_contiguous() and w64.is_contiguous():
        x_chunks, w_chunks = x64.view(m, whole, chunk), w64.view(n, whole, chunk)
    else:
        x_chunks = x64[:, : whole * chunk].reshape(m, whole, chunk)
        w_chunks = w64[:, : whole * chunk].reshape(n, whole, chunk)
    total = torch.bmm(x_chunks.transpose(0, 1), w_chunks.permute(1, 2, 0)).sum(0)
    if whole * chunk < k:
        total.addmm_(x64[:, whole * chunk :], w64[:, whole * chunk :].T)
    return total


def product_factor(k: int, chunk: int = CHUNK) -> float:
    """gamma(D) * SLACK for float64_total's products of K columns, a float32 rounded up."""
    chunks = -(-k // chunk)
    return upward_float32(gamma(min(k, chunk) + chunks + 1) * SLACK)


def upper_norms(rows64: torch.Tensor) -> torch.Tensor:
    """An upper bound of each row's Euclidean norm (rows along the last axis): squares are
    exact, their float64 sum is raised by gamma(K) to cover its rounding, and SLACK covers
    the square root's."""
    squares = torch.linalg.vecdot(rows64, rows64)  # no squared copy; any order, fused or not, is within gamma(K)
    return squares.mul_(1 + gamma(max(rows64.shape[-1], 1))).sqrt_().mul_(SLACK)
