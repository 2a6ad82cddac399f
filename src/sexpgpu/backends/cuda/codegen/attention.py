"""Fused scaled dot-product attention in Triton, forward and backward, in a fixed order.

Operands are 4-d views (lead, heads, T, E) with any strides; the row statistics (the
log-sum-exp of each query's scores, and D for the backward) are float32
(lead, heads, T) contiguous. Four kernels:

- `forward`: one program per (query block, lead and head). It walks the key blocks from the
  first in increasing order (a causal program stops at its last query), keeping the online
  softmax's running maximum m, running sum l and unnormalised output: for each block
  s = (q k^T) * scale, masked to -inf, m' = max(m, max s), l = l exp(m - m') + sum exp(s - m'),
  acc = acc exp(m - m') + exp(s - m') v. It stores acc / l and lse = m + log l.
- `score_delta` (float32) or `row_delta` (bf16): D per query, one program per (query block,
  lead and head): rowsum(P * dO v^T) from the products the backward kernels form, walking the
  key blocks as the forward does, or rowsum(dO * O).
- `backward_kv`: one program per (key block, lead and head), walking the query blocks that
  see it in increasing order: P = exp(s - lse), dV += P^T dO, dS = P (dO v^T - D),
  dK += dS^T q; dK is scaled once at the end.
- `backward_q`: one program per (query block, lead and head), walking key blocks as the
  forward does: dQ += dS k, scaled once at the end.

Each output element is written by one program, whose sums run over blocks in an order fixed
by the shapes and the block sizes (functions of the shapes and dtype alone), and within a
block by `tl.dot`'s fixed reduction: no atomics, so every run gives the same bits. bf16
operands reach the products as bf16 (float32 accumulation); the scores are rounded to bf16
as the interpreter's bf16 product rounds them, and the probabilities and dS are rounded to
bf16 where they enter a product. Statistics and sums stay float32. Float32 products are
3xTF32 on the tensor cores (`input_precision="tf32x3"`): each operand is split into a tf32
part and the rest, and the three products of parts other than rest x rest are summed in
float32. That drops about 2^-22 of each term, where an IEEE float32 product rounds to 2^-24,
and runs on the tensor cores instead of multiply-adds (docs/cuda.md, "Attention").

Under Triton's interpreter (CPU tensors), bf16 values are widened to float32 through their
bits before a product (its products are then exact, the sum float32, as on the GPU); float32
operands are split into their tf32 parts by the kernel itself (`_dot_3xtf32`), since the
interpreter ignores input_precision; and loops whose bounds depend on the program are
`while` loops, which the interpreter can run.
As in generated kernels (compile.py), no @triton.jit function of triton.language.standard
(tl.sum, tl.max, tl.zeros) is called: reductions are tl.reduce with bits.py's combiners.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from sexpgpu.backends.cuda import attention_wide
from sexpgpu.backends.cuda.codegen.bits import add, load_bf16, max_nan, round_bf16, store_bf16

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _operand(x, BF16: tl.constexpr, NATIVE: tl.constexpr):
    """A float32 value as a product's operand: rounded to bf16 for a bf16 op (a bfloat16
    tensor where the dot takes one)."""
    if BF16:
        if NATIVE:
            return store_bf16(x)
        else:
            return round_bf16(x)
    else:
        return x


@triton.jit
def _load_operand(pointers, mask, BF16: tl.constexpr, NATIVE: tl.constexpr):
    """Stored values as a product's operand: as stored, or widened where the dot cannot take
    bf16 (NATIVE False: always widened to float32)."""
    value = tl.load(pointers, mask=mask, other=0.0)
    if BF16 and not NATIVE:
        return load_bf16(value)
    else:
        return value


@triton.jit
def _tf32_parts(x):
    """(big, small) with x = big + small + what 3xTF32 drops: big is x rounded to the
    nearest tf32 (10 fraction bits, ties away from zero: cvt.rna.tf32.f32), small the rest
    as the tensor core reads it (its low 13 bits dropped). NaN stays in big."""
    bits = x.to(tl.uint32, bitcast=True)
    big = tl.where(x != x, x, (((bits + 0x1000) >> 13) << 13).to(tl.float32, bitcast=True))
    rest = (x - big).to(tl.uint32, bitcast=True)
    return big, ((rest >> 13) << 13).to(tl.float32, bitcast=True)


@triton.jit
def _dot_3xtf32(a, b):
    """a b as Triton's tf32x3 computes it on the GPU, for Triton's interpreter (which
    ignores input_precision): small a x big b, plus big a x small b, NaN cleared (an infinite
    operand's small part is NaN), plus big a x big b, each product of parts summed in float32."""
    a_big, a_small = _tf32_parts(a)
    b_big, b_small = _tf32_parts(b)
    correction = tl.dot(a_big, b_small, tl.dot(a_small, b_big, input_precision="ieee"), input_precision="ieee")
    correction = tl.where(correction != correction, 0.0, correction)
    return tl.dot(a_big, b_big, correction, input_precision="ieee")


@triton.jit
def _dot(a, b, BF16: tl.constexpr, NATIVE: tl.constexpr):
    """A product of two tiles: bf16 operands on the tensor cores with float32 sums; float32
    operands as 3xTF32 on the tensor cores (the module's docstring says why and what it drops)."""
    if BF16:
        return tl.dot(a, b)
    elif NATIVE:
        return tl.dot(a, b, input_precision="tf32x3")
    else:
        return _dot_3xtf32(a, b)


@triton.jit
def _store_result(pointers, value, mask, OUT_BF16: tl.constexpr):
    """A float32 result stored as the output's dtype (bf16: rounded to nearest even)."""
    if OUT_BF16:
        tl.store(pointers, store_bf16(value), mask=mask)
    else:
        tl.store(pointers, value, mask=mask)


@triton.jit
def _program_head(HEADS, LEAD0):
    """(lead, batch, head) of this program: axis 1 walks batch * heads from LEAD0 (a launch
    covers at most MAX_GRID_Y of them, the grid's limit on axis 1)."""
    lead = tl.program_id(1).to(tl.int64) + LEAD0
    return lead, lead // HEADS, lead % HEADS


@triton.jit
def _keys_seen(TK, start_m, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """Where a block of queries' walk over the keys stops: a causal block at its last query."""
    if CAUSAL:
        return tl.minimum(TK, start_m + BLOCK_M)
    else:
        return TK


@triton.jit
def _scores(a, b, queries, keys, TQ, TK, scale, BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr):
    """(a b) * scale, -inf where masked: `queries` and `keys` are the tile's query and key
    indices laid out along its axes (queries[:, None] and keys[None, :] for q k^T, the other
    way round for the transposed tile k q^T)."""
    s = _dot(a, b, BF16, NATIVE)
    if BF16:
        s = round_bf16(s)
    s = s * scale
    valid = (queries < TQ) & (keys < TK)
    if CAUSAL:
        valid = valid & (keys <= queries)
    return tl.where(valid, s, NEG_INF)


@triton.jit
def _forward_block(q, m_i, l_i, acc, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ, TK, scale,
                   E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                   BLOCK_N: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr):
    cols = start_n + tl.arange(0, BLOCK_N)
    e = tl.arange(0, BLOCK_E)
    ev = tl.arange(0, BLOCK_EV)
    key_t = _load_operand(K + k_base + cols[None, :] * skt + e[:, None] * ske,
                          (cols[None, :] < TK) & (e[:, None] < E), BF16, NATIVE)
    s = _scores(q, key_t, rows[:, None], cols[None, :], TQ, TK, scale, BF16, NATIVE, CAUSAL)
    m_new = tl.maximum(m_i, tl.reduce(s, 1, max_nan))
    m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)  # a row with nothing seen yet keeps l = 0
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.reduce(p, 1, add)
    value = _load_operand(V + v_base + cols[:, None] * svt + ev[None, :] * sve,
                          (cols[:, None] < TK) & (ev[None, :] < EV), BF16, NATIVE)
    acc = acc * alpha[:, None] + _dot(_operand(p, BF16, NATIVE), value, BF16, NATIVE)
    return m_new, l_i, acc


@triton.jit
def forward(Q, K, V, O, LSE, sq0, sq1, sqt, sqe, sk0, sk1, skt, ske, sv0, sv1, svt, sve, so0, so1, sot, soe,
            HEADS, LEAD0, TQ, TK, scale, E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr,
            CAUSAL: tl.constexpr, OUT_BF16: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    lead, batch, head = _program_head(HEADS, LEAD0)
    rows = start_m + tl.arange(0, BLOCK_M)
    e = tl.arange(0, BLOCK_E)
    ev = tl.arange(0, BLOCK_EV)
    q = _load_operand(Q + batch * sq0 + head * sq1 + rows[:, None] * sqt + e[None, :] * sqe,
                      (rows[:, None] < TQ) & (e[None, :] < E), BF16, NATIVE)
    k_base, v_base = batch * sk0 + head * sk1, batch * sv0 + head * sv1
    m_i = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_EV], 0.0, tl.float32)
    stop = _keys_seen(TK, start_m, BLOCK_M, CAUSAL)
    if NATIVE:
        for start_n in range(0, stop, BLOCK_N):
            m_i, l_i, acc = _forward_block(q, m_i, l_i, acc, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve,
                                           TQ, TK, scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_N, BF16, NATIVE, CAUSAL)
    else:
        start_n = 0
        while start_n < stop:
            m_i, l_i, acc = _forward_block(q, m_i, l_i, acc, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve,
                                           TQ, TK, scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_N, BF16, NATIVE, CAUSAL)
            start_n += BLOCK_N
    out = acc / l_i[:, None]
    out_mask = (rows[:, None] < TQ) & (ev[None, :] < EV)
    out_pointers = O + batch * so0 + head * so1 + rows[:, None] * sot + ev[None, :] * soe
    _store_result(out_pointers, out, out_mask, OUT_BF16)
    tl.store(LSE + lead * TQ + rows, m_i + tl.log(l_i), mask=rows < TQ)


@triton.jit
def row_delta(O, G, DELTA, so0, so1, sot, soe, sg0, sg1, sgt, sge, HEADS, LEAD0, TQ, EV: tl.constexpr,
              BLOCK_EV: tl.constexpr, BLOCK_M: tl.constexpr, BF16: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    lead, batch, head = _program_head(HEADS, LEAD0)
    ev = tl.arange(0, BLOCK_EV)
    mask = (rows[:, None] < TQ) & (ev[None, :] < EV)
    o = _load_operand(O + batch * so0 + head * so1 + rows[:, None] * sot + ev[None, :] * soe, mask, BF16, False)
    g = _load_operand(G + batch * sg0 + head * sg1 + rows[:, None] * sgt + ev[None, :] * sge, mask, BF16, False)
    tl.store(DELTA + lead * TQ + rows, tl.reduce(o * g, 1, add), mask=rows < TQ)


@triton.jit
def _query_rows(Q, G, LSE, rows, row_mask, lead, batch, head, sq0, sq1, sqt, sqe, sg0, sg1, sgt, sge, TQ,
                E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                BF16: tl.constexpr, NATIVE: tl.constexpr):
    """(q, dO, lse) of a block of queries, for the programs that walk the key blocks."""
    e = tl.arange(0, BLOCK_E)
    ev = tl.arange(0, BLOCK_EV)
    q = _load_operand(Q + batch * sq0 + head * sq1 + rows[:, None] * sqt + e[None, :] * sqe,
                      row_mask[:, None] & (e[None, :] < E), BF16, NATIVE)
    g = _load_operand(G + batch * sg0 + head * sg1 + rows[:, None] * sgt + ev[None, :] * sge,
                      row_mask[:, None] & (ev[None, :] < EV), BF16, NATIVE)
    return q, g, tl.load(LSE + lead * TQ + rows, mask=row_mask, other=0.0)


@triton.jit
def _p_and_score_grad(q, g, lse, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ, TK, scale,
                      E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                      BLOCK_N: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr):
    """(P, dP = dO v^T, k) over a block of queries and the key block at start_n: the one place
    score_delta and backward_q form them, so that both take the same dP."""
    cols = start_n + tl.arange(0, BLOCK_N)
    e = tl.arange(0, BLOCK_E)
    ev = tl.arange(0, BLOCK_EV)
    seen = cols < TK
    key = _load_operand(K + k_base + cols[:, None] * skt + e[None, :] * ske,
                        seen[:, None] & (e[None, :] < E), BF16, NATIVE)
    p = tl.exp(_scores(q, tl.trans(key), rows[:, None], cols[None, :], TQ, TK, scale, BF16, NATIVE, CAUSAL) - lse[:, None])
    value_t = _load_operand(V + v_base + cols[None, :] * svt + ev[:, None] * sve,
                            seen[None, :] & (ev[:, None] < EV), BF16, NATIVE)
    return p, _dot(g, value_t, BF16, NATIVE), key


@triton.jit
def _delta_block(q, g, lse, delta, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ, TK, scale,
                 E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                 BLOCK_N: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr):
    p, dp, _ = _p_and_score_grad(q, g, lse, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ, TK,
                                 scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_N, BF16, NATIVE, CAUSAL)
    return delta + tl.reduce(p * dp, 1, add)


@triton.jit
def score_delta(Q, K, V, G, LSE, DELTA, sq0, sq1, sqt, sqe, sk0, sk1, skt, ske, sv0, sv1, svt, sve,
                sg0, sg1, sgt, sge, HEADS, LEAD0, TQ, TK, scale, E: tl.constexpr, EV: tl.constexpr,
                BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    lead, batch, head = _program_head(HEADS, LEAD0)
    rows = start_m + tl.arange(0, BLOCK_M)
    row_mask = rows < TQ
    q, g, lse = _query_rows(Q, G, LSE, rows, row_mask, lead, batch, head, sq0, sq1, sqt, sqe, sg0, sg1, sgt, sge,
                            TQ, E, EV, BLOCK_E, BLOCK_EV, BF16, NATIVE)
    k_base, v_base = batch * sk0 + head * sk1, batch * sv0 + head * sv1
    delta = tl.full([BLOCK_M], 0.0, tl.float32)
    stop = _keys_seen(TK, start_m, BLOCK_M, CAUSAL)
    if NATIVE:
        for start_n in range(0, stop, BLOCK_N):
            delta = _delta_block(q, g, lse, delta, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ,
                                 TK, scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_N, BF16, NATIVE, CAUSAL)
    else:
        start_n = 0
        while start_n < stop:
            delta = _delta_block(q, g, lse, delta, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ,
                                 TK, scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_N, BF16, NATIVE, CAUSAL)
            start_n += BLOCK_N
    tl.store(DELTA + lead * TQ + rows, delta, mask=row_mask)


@triton.jit
def _kv_block(k, v, dk, dv, start_m, keys, Q, G, LSE, DELTA, q_base, g_base, stat_base, sqt, sqe, sgt, sge,
              TQ, TK, scale, E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
              BLOCK_M: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr,
              DS, ds_base, STORE_DS: tl.constexpr):
    queries = start_m + tl.arange(0, BLOCK_M)
    e = tl.arange(0, BLOCK_E)
    ev = tl.arange(0, BLOCK_EV)
    seen = queries < TQ
    query = _load_operand(Q + q_base + queries[:, None] * sqt + e[None, :] * sqe,
                          seen[:, None] & (e[None, :] < E), BF16, NATIVE)
    lse = tl.load(LSE + stat_base + queries, mask=seen, other=0.0)
    delta = tl.load(DELTA + stat_base + queries, mask=seen, other=0.0)
    p_t = tl.exp(_scores(k, tl.trans(query), queries[None, :], keys[:, None], TQ, TK, scale, BF16, NATIVE, CAUSAL)
                 - lse[None, :])
    g = _load_operand(G + g_base + queries[:, None] * sgt + ev[None, :] * sge,
                      seen[:, None] & (ev[None, :] < EV), BF16, NATIVE)
    dv += _dot(_operand(p_t, BF16, NATIVE), g, BF16, NATIVE)
    ds_t = p_t * (_dot(v, tl.trans(g), BF16, NATIVE) - delta[None, :])
    if STORE_DS:  # for backward_q_from_ds: dS[query, key], stored as the product's operand rounds it
        _store_result(DS + ds_base + queries[None, :] * TK + keys[:, None], ds_t,
                      seen[None, :] & (keys[:, None] < TK), BF16)
    dk += _dot(_operand(ds_t, BF16, NATIVE), query, BF16, NATIVE)
    return dk, dv


@triton.jit
def backward_kv(Q, K, V, G, LSE, DELTA, DK, DV, DS, sq0, sq1, sqt, sqe, sk0, sk1, skt, ske, sv0, sv1, svt, sve,
                sg0, sg1, sgt, sge, sdk0, sdk1, sdkt, sdke, sdv0, sdv1, sdvt, sdve, HEADS, LEAD0, TQ, TK, scale,
                E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr,
                CAUSAL: tl.constexpr, OUT_BF16: tl.constexpr, STORE_DS: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    lead, batch, head = _program_head(HEADS, LEAD0)
    keys = start_n + tl.arange(0, BLOCK_N)
    e = tl.arange(0, BLOCK_E)
    ev = tl.arange(0, BLOCK_EV)
    key_mask = keys[:, None] < TK
    k = _load_operand(K + batch * sk0 + head * sk1 + keys[:, None] * skt + e[None, :] * ske,
                      key_mask & (e[None, :] < E), BF16, NATIVE)
    v = _load_operand(V + batch * sv0 + head * sv1 + keys[:, None] * svt + ev[None, :] * sve,
                      key_mask & (ev[None, :] < EV), BF16, NATIVE)
    dk = tl.full([BLOCK_N, BLOCK_E], 0.0, tl.float32)
    dv = tl.full([BLOCK_N, BLOCK_EV], 0.0, tl.float32)
    q_base, g_base, stat_base = batch * sq0 + head * sq1, batch * sg0 + head * sg1, lead * TQ
    ds_base = stat_base * TK  # dS is (lead, TQ, TK) contiguous
    first = 0
    if CAUSAL:
        first = (start_n // BLOCK_M) * BLOCK_M
    if NATIVE:
        for start_m in range(first, TQ, BLOCK_M):
            dk, dv = _kv_block(k, v, dk, dv, start_m, keys, Q, G, LSE, DELTA, q_base, g_base, stat_base, sqt, sqe,
                               sgt, sge, TQ, TK, scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_M, BF16, NATIVE, CAUSAL,
                               DS, ds_base, STORE_DS)
    else:
        start_m = first
        while start_m < TQ:
            dk, dv = _kv_block(k, v, dk, dv, start_m, keys, Q, G, LSE, DELTA, q_base, g_base, stat_base, sqt, sqe,
                               sgt, sge, TQ, TK, scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_M, BF16, NATIVE, CAUSAL,
                               DS, ds_base, STORE_DS)
            start_m += BLOCK_M
    dk = dk * scale
    dk_pointers = DK + batch * sdk0 + head * sdk1 + keys[:, None] * sdkt + e[None, :] * sdke
    dv_pointers = DV + batch * sdv0 + head * sdv1 + keys[:, None] * sdvt + ev[None, :] * sdve
    dk_mask, dv_mask = key_mask & (e[None, :] < E), key_mask & (ev[None, :] < EV)
    _store_result(dk_pointers, dk, dk_mask, OUT_BF16)
    _store_result(dv_pointers, dv, dv_mask, OUT_BF16)


@triton.jit
def _q_block(q, g, lse, delta, dq, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ, TK, scale,
             E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
             BLOCK_N: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr):
    p, dp, key = _p_and_score_grad(q, g, lse, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ, TK,
                                   scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_N, BF16, NATIVE, CAUSAL)
    ds = p * (dp - delta[:, None])
    return dq + _dot(_operand(ds, BF16, NATIVE), key, BF16, NATIVE)


@triton.jit
def backward_q(Q, K, V, G, LSE, DELTA, DQ, sq0, sq1, sqt, sqe, sk0, sk1, skt, ske, sv0, sv1, svt, sve,
               sg0, sg1, sgt, sge, sdq0, sdq1, sdqt, sdqe, HEADS, LEAD0, TQ, TK, scale,
               E: tl.constexpr, EV: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr,
               CAUSAL: tl.constexpr, OUT_BF16: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    lead, batch, head = _program_head(HEADS, LEAD0)
    rows = start_m + tl.arange(0, BLOCK_M)
    row_mask = rows < TQ
    q, g, lse = _query_rows(Q, G, LSE, rows, row_mask, lead, batch, head, sq0, sq1, sqt, sqe, sg0, sg1, sgt, sge,
                            TQ, E, EV, BLOCK_E, BLOCK_EV, BF16, NATIVE)
    delta = tl.load(DELTA + lead * TQ + rows, mask=row_mask, other=0.0)
    k_base, v_base = batch * sk0 + head * sk1, batch * sv0 + head * sv1
    dq = tl.full([BLOCK_M, BLOCK_E], 0.0, tl.float32)
    stop = _keys_seen(TK, start_m, BLOCK_M, CAUSAL)
    if NATIVE:
        for start_n in range(0, stop, BLOCK_N):
            dq = _q_block(q, g, lse, delta, dq, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ, TK,
                          scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_N, BF16, NATIVE, CAUSAL)
    else:
        start_n = 0
        while start_n < stop:
            dq = _q_block(q, g, lse, delta, dq, start_n, rows, K, V, k_base, v_base, skt, ske, svt, sve, TQ, TK,
                          scale, E, EV, BLOCK_E, BLOCK_EV, BLOCK_N, BF16, NATIVE, CAUSAL)
            start_n += BLOCK_N
    dq = dq * scale
    e = tl.arange(0, BLOCK_E)
    pointers = DQ + batch * sdq0 + head * sdq1 + rows[:, None] * sdqt + e[None, :] * sdqe
    mask = row_mask[:, None] & (e[None, :] < E)
    _store_result(pointers, dq, mask, OUT_BF16)


@triton.jit
def _q_ds_block(dq, start_n, rows, DS, ds_base, K, k_base, skt, ske, TQ, TK, E: tl.constexpr, BLOCK_E: tl.constexpr,
                BLOCK_N: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr):
    cols = start_n + tl.arange(0, BLOCK_N)
    e = tl.arange(0, BLOCK_E)
    seen = (rows[:, None] < TQ) & (cols[None, :] < TK)
    if CAUSAL:
        seen = seen & (cols[None, :] <= rows[:, None])  # backward_kv wrote every entry a row sees
    ds = _load_operand(DS + ds_base + rows[:, None] * TK + cols[None, :], seen, BF16, NATIVE)
    key = _load_operand(K + k_base + cols[:, None] * skt + e[None, :] * ske,
                        (cols[:, None] < TK) & (e[None, :] < E), BF16, NATIVE)
    return dq + _dot(ds, key, BF16, NATIVE)


@triton.jit
def backward_q_from_ds(DS, K, DQ, sk0, sk1, skt, ske, sdq0, sdq1, sdqt, sdqe, HEADS, LEAD0, TQ, TK, scale,
                       E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BF16: tl.constexpr, NATIVE: tl.constexpr, CAUSAL: tl.constexpr, OUT_BF16: tl.constexpr):
    """dQ = scale * dS k, dS as backward_kv stored it: one program per (query block, lead and
    head), walking key blocks as backward_q does."""
    start_m = tl.program_id(0) * BLOCK_M
    lead, batch, head = _program_head(HEADS, LEAD0)
    rows = start_m + tl.arange(0, BLOCK_M)
    e = tl.arange(0, BLOCK_E)
    ds_base = lead * TQ * TK
    k_base = batch * sk0 + head * sk1
    dq = tl.full([BLOCK_M, BLOCK_E], 0.0, tl.float32)
    stop = _keys_seen(TK, start_m, BLOCK_M, CAUSAL)
    if NATIVE:
        for start_n in range(0, stop, BLOCK_N):
            dq = _q_ds_block(dq, start_n, rows, DS, ds_base, K, k_base, skt, ske, TQ, TK, E, BLOCK_E, BLOCK_N, BF16,
                             NATIVE, CAUSAL)
    else:
        start_n = 0
        while start_n < stop:
            dq = _q_ds_block(dq, start_n, rows, DS, ds_base, K, k_base, skt, ske, TQ, TK, E, BLOCK_E, BLOCK_N, BF16,
                             NATIVE, CAUSAL)
            start_n += BLOCK_N
    dq = dq * scale
    pointers = DQ + batch * sdq0 + head * sdq1 + rows[:, None] * sdqt + e[None, :] * sdqe
    _store_result(pointers, dq, (rows[:, None] < TQ) & (e[None, :] < E), OUT_BF16)


# --- launching ----------------------------------------------------------------------------------------------


class Blocks(NamedTuple):
    m: int  # queries a program (or a step of the key-block loop) takes
    n: int  # keys a program (or a step of the query-block loop) takes
    warps: int
    stages: int


def _power_of_two(size: int, least: int = 16) -> int:
    return max(least, 1 << (max(size, 1) - 1).bit_length())


# (kernel, dtype, padded head width over 64) -> tiles on the GPU. Float32 heads are fused up
# to 64 wide: the 3xTF32 products hold each operand twice (its tf32 parts), and wider tiles
# spill registers. The backward kernels' own block (queries for dQ, keys for dK and dV) is
# the tensor cores' 64 rows or more. The float32 tiles are the fastest of those timed on an
# H200 at gpt-50m's heads (32 x 8 heads of 512 x 64, causal; docs/cuda.md, "Attention").
TILES = {
    ("forward", "bf16", False): Blocks(128, 64, 8, 2),
    ("forward", "bf16", True): Blocks(64, 64, 4, 2),
    ("backward_kv", "bf16", False): Blocks(64, 64, 4, 2),
    ("backward_kv", "bf16", True): Blocks(64, 32, 4, 1),
    ("backward_q", "bf16", False): Blocks(64, 64, 4, 2),
    ("backward_q", "bf16", True): Blocks(64, 32, 4, 1),
    ("backward_q_from_ds", "bf16", False): Blocks(64, 64, 4, 2),
    ("backward_q_from_ds", "bf16", True): Blocks(64, 32, 4, 2),
    ("backward_q_from_ds", "f32", False): Blocks(64, 64, 4, 2),
    ("forward", "f32", False): Blocks(64, 64, 4, 2),
    ("backward_kv", "f32", False): Blocks(32, 128, 8, 3),
    ("backward_q", "f32", False): Blocks(128, 64, 8, 2),
}
# dS in memory, lead x TQ x TK elements of q's dtype, up to this many bytes: backward_kv stores
# it and dQ is one product of it (backward_q_from_ds) instead of backward_q's three with the
# probabilities recomputed; longer sequences keep memory linear in T (backward_q)
MAX_DS_BYTES = 1 << 30


def ds_in_memory(lead: int, queries: int, keys: int, bf16: bool) -> bool:
    return lead * queries * keys * (2 if bf16 else 4) <= MAX_DS_BYTES


# the widest head each dtype's fused kernels take; wider ones run attention_wide.py
MAX_FUSED_WIDTH = {"bf16": 128, "f32": 64}
INTERPRETED_TILES = Blocks(16, 16, 1, 1)  # many blocks, partial ones included, on small test shapes


def blocks(kind: str, bf16: bool, width: int, native: bool) -> Blocks:
    """The tiles of a kernel: functions of the kernel, the dtype and the padded head width
    alone, so a shape always runs the same sums."""
    if not native:
        return INTERPRETED_TILES
    return TILES[(kind, _dtype(bf16), width > 64)]


def _dtype(bf16: bool) -> str:
    return "bf16" if bf16 else "f32"


def fused(width: int, value_width: int, bf16: bool) -> bool:
    """Whether the fused kernels take heads this wide (else attention_wide.py runs them)."""
    return max(width, value_width) <= MAX_FUSED_WIDTH[_dtype(bf16)]


MAX_GRID_Y = 65535  # CUDA's limit on a grid's second axis


def _lead_chunks(total: int):
    """(first, count) of each launch's run of the batch * heads programs: at most MAX_GRID_Y
    a launch, so any batch and head count runs (2048 x 32 heads is one more than a grid holds)."""
    return [(first, min(MAX_GRID_Y, total - first)) for first in range(0, total, MAX_GRID_Y)]


def _strides(*tensors) -> list:
    return [stride for tensor in tensors for stride in tensor.stride()]


def _launch_options(tile: Blocks, native: bool) -> dict:
    options = {"num_warps": tile.warps, "num_stages": tile.stages} if native else {}
    return dict(options, enable_fp_fusion=False)


def _sizes(q, v) -> tuple:
    """(E, EV, padded E, padded EV, bf16, native) of 4-d operands."""
    import torch

    width, value_width = q.shape[-1], v.shape[-1]
    return width, value_width, _power_of_two(width), _power_of_two(value_width), q.dtype == torch.bfloat16, q.is_cuda


def run_forward(q, k, v, out, lse, scale: float, causal: bool) -> None:
    """out = attention(q, k, v) and lse = the log-sum-exp of each query's scores, for
    4-d (lead, heads, T, E) views; lse is float32 (lead, heads, TQ) contiguous."""
    width, value_width, block_e, block_ev, bf16, native = _sizes(q, v)
    if not fused(width, value_width, bf16):
        return attention_wide.forward(q, k, v, out, lse, scale, causal)
    tile = blocks("forward", bf16, max(block_e, block_ev), native)
    lead, heads, queries, keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    for lead0, count in _lead_chunks(lead * heads):
        forward[(triton.cdiv(queries, tile.m), count)](
            q, k, v, out, lse, *_strides(q, k, v, out), heads, lead0, queries, keys, scale, width, value_width,
            block_e, block_ev, tile.m, tile.n, bf16, native, causal, bf16, **_launch_options(tile, native))


def run_row_delta(out, g, delta) -> None:
    """delta = rowsum(out * g) in float32, (lead, heads, TQ) contiguous."""
    _, value_width, _, block_ev, bf16, native = _sizes(g, g)
    rows = 16 if not native else max(16, min(128, 8192 // block_ev))
    lead, heads, queries = out.shape[0], out.shape[1], out.shape[2]
    for lead0, count in _lead_chunks(lead * heads):
        row_delta[(triton.cdiv(queries, rows), count)](out, g, delta, *_strides(out, g), heads, lead0, queries,
                                                       value_width, block_ev, rows, bf16, enable_fp_fusion=False)


def delta_from_products(bf16: bool) -> bool:
    """Whether the fused kernels take D for the forward's own output from score_delta (float32)
    rather than row_delta. A bf16 head's dS is rounded to bf16 where it enters a product, far
    coarser than the 2^-22 of |dO| |O| that rowsum(dO * O) leaves, so it keeps the cheaper sum."""
    return not bf16


def run_score_delta(q, k, v, g, lse, delta, scale: float, causal: bool) -> None:
    """delta = rowsum(P * dP) in float32, (lead, heads, TQ) contiguous, dP = dO v^T formed as
    backward_q forms it: for the forward's own output it equals rowsum(dO * O) in exact
    arithmetic, and a one-hot row's dS is then zero, or a rounding of dP (backward_kv adds
    3xTF32's cross terms in the other order), where rowsum(dO * O) left 2^-22 of |dO| |O|."""
    width, value_width, block_e, block_ev, bf16, native = _sizes(q, v)
    tile = blocks("backward_q", bf16, max(block_e, block_ev), native)
    lead, heads, queries, keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    for lead0, count in _lead_chunks(lead * heads):
        score_delta[(triton.cdiv(queries, tile.m), count)](
            q, k, v, g, lse, delta, *_strides(q, k, v, g), heads, lead0, queries, keys, scale, width, value_width,
            block_e, block_ev, tile.m, tile.n, bf16, native, causal, **_launch_options(tile, native))


def run_backward_kv(q, k, v, g, lse, delta, dk, dv, scale: float, causal: bool, ds=None) -> None:
    """dk and dv; with `ds` (lead x heads x TQ x TK elements of q's dtype, contiguous), also
    dS there, for run_backward_q_from_ds."""
    width, value_width, block_e, block_ev, bf16, native = _sizes(q, v)
    if not fused(width, value_width, bf16):
        return attention_wide.backward_kv(q, k, v, g, lse, delta, dk, dv, scale, causal)
    tile = blocks("backward_kv", bf16, max(block_e, block_ev), native)
    lead, heads, queries, keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    for lead0, count in _lead_chunks(lead * heads):
        backward_kv[(triton.cdiv(keys, tile.n), count)](
            q, k, v, g, lse, delta, dk, dv, dk if ds is None else ds, *_strides(q, k, v, g, dk, dv), heads, lead0,
            queries, keys, scale, width, value_width, block_e, block_ev, tile.m, tile.n, bf16, native, causal, bf16,
            ds is not None, **_launch_options(tile, native))


def run_backward_q_from_ds(ds, k, dq, scale: float, causal: bool) -> None:
    """dq = scale * dS k, from the dS that run_backward_kv stored."""
    width, _, block_e, _, bf16, native = _sizes(k, k)
    tile = blocks("backward_q_from_ds", bf16, block_e, native)
    lead, heads, queries, keys = dq.shape[0], dq.shape[1], dq.shape[2], k.shape[2]
    for lead0, count in _lead_chunks(lead * heads):
        backward_q_from_ds[(triton.cdiv(queries, tile.m), count)](
            ds, k, dq, *_strides(k, dq), heads, lead0, queries, keys, scale, width, block_e, tile.m, tile.n, bf16,
            native, causal, bf16, **_launch_options(tile, native))


def run_backward_q(q, k, v, g, lse, delta, dq, scale: float, causal: bool) -> None:
    width, value_width, block_e, block_ev, bf16, native = _sizes(q, v)
    if not fused(width, value_width, bf16):
        return attention_wide.backward_q(q, k, v, g, lse, delta, dq, scale, causal)
    tile = blocks("backward_q", bf16, max(block_e, block_ev), native)
    lead, heads, queries, keys = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    for lead0, count in _lead_chunks(lead * heads):
        backward_q[(triton.cdiv(queries, tile.m), count)](
            q, k, v, g, lse, delta, dq, *_strides(q, k, v, g, dq), heads, lead0, queries, keys, scale,
            width, value_width, block_e, block_ev, tile.m, tile.n, bf16, native, causal, bf16,
            **_launch_options(tile, native))
