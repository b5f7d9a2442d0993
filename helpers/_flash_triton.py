"""Lesson 10's FlashAttention forward, and its backward, as Triton kernels, in their own module (lesson 10).

Imported only by ``helpers.flash.triton_flash_attention`` and ``triton_flash_attention_backward``, so
that importing ``helpers.flash`` never
needs Triton. The kernel sits at module level, where ``tl`` is a global: the Triton that
torch 2.5 brings (3.1) reads the names a kernel uses from its module's globals, and rejects a
kernel defined inside a function.
"""

import triton
import triton.language as tl


@triton.jit
def flash_forward_kernel(Q, K, V, O, T, S, qk_scale, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                         D: tl.constexpr, CAUSAL: tl.constexpr):
    # One program computes BLOCK_Q rows of the output of one (batch, head); all tensors contiguous.
    i = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # the query rows of this program
    d = tl.arange(0, D)
    head = tl.program_id(1)  # which (batch, head): its rows start at head * T * D in q and out
    Q += head * T * D
    K += head * S * D
    V += head * S * D
    O += head * T * D
    q = tl.load(Q + i[:, None] * D + d[None, :], mask=i[:, None] < T, other=0.0)  # (BLOCK_Q, D)
    m = tl.full([BLOCK_Q], float("-inf"), tl.float32)  # running max (in base-2 units)
    l_sum = tl.zeros([BLOCK_Q], tl.float32)  # running sum of exponentials
    acc = tl.zeros([BLOCK_Q, D], tl.float32)  # running sum of exponentials times values
    end = S
    if CAUSAL:  # key blocks that start after the last query row are never touched
        end = tl.minimum((tl.program_id(0) + 1) * BLOCK_Q, S)
    for j0 in range(0, end, BLOCK_K):
        j = j0 + tl.arange(0, BLOCK_K)  # the key rows of this tile
        k = tl.load(K + j[:, None] * D + d[None, :], mask=j[:, None] < S, other=0.0)  # (BLOCK_K, D)
        v = tl.load(V + j[:, None] * D + d[None, :], mask=j[:, None] < S, other=0.0)  # (BLOCK_K, D)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_Q, BLOCK_K) scores, times log2(e)
        keep = j[None, :] < S  # keys past the end of the sequence are padding
        if CAUSAL:
            keep = keep & (j[None, :] <= i[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # key 0 is always kept, so m_new is finite
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_Q, BLOCK_K)
        rescale = tl.exp2(m - m_new)  # (BLOCK_Q,)
        l_sum = l_sum * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)  # (BLOCK_Q, D)
        m = m_new
    tl.store(O + i[:, None] * D + d[None, :], (acc / l_sum[:, None]).to(O.dtype.element_ty),
             mask=i[:, None] < T)


# --- the backward (FlashAttention-2, Dao 2023, Algorithm 2) as two kernels: a dK/dV pass and a dQ pass ---
# Each recomputes its tiles of weights from the saved log-sum-exp LSE (natural log, float32) and uses
# DELTA = rowsum(dO * O); no (T, S) matrix is stored. The dK/dV pass owns a block of keys and walks over
# the query blocks; the dQ pass owns a block of queries and walks over the key blocks, so that no two
# programs write the same rows and no atomic additions are needed.

@triton.jit
def _load_rows(X, rows, n, D: tl.constexpr):
    """Rows ``rows`` of an (n, D) matrix at X, zeros past its end: a (len(rows), D) tile."""
    d = tl.arange(0, D)
    return tl.load(X + rows[:, None] * D + d[None, :], mask=rows[:, None] < n, other=0.0)


@triton.jit
def _store_rows(X, rows, n, D: tl.constexpr, tile):
    d = tl.arange(0, D)
    tl.store(X + rows[:, None] * D + d[None, :], tile.to(X.dtype.element_ty), mask=rows[:, None] < n)


@triton.jit
def _query_block(Q, DO, LSE, DELTA, i, T, D: tl.constexpr):
    """A block of queries with what the backward saved for them: q, dO (BLOCK_Q, D), lse, D_i (BLOCK_Q,)."""
    return (_load_rows(Q, i, T, D), _load_rows(DO, i, T, D), tl.load(LSE + i, mask=i < T, other=0.0),
            tl.load(DELTA + i, mask=i < T, other=0.0))


@triton.jit
def _weights_and_ds(q, k, v, do, lse, delta, i, j, T, S, scale, CAUSAL: tl.constexpr):
    """One tile: the forward's weights P, recomputed from lse, and dS = P * (dP - D_i), both (BLOCK_Q, BLOCK_K)."""
    s = tl.dot(q, tl.trans(k)) * scale  # scaled scores
    keep = (i[:, None] < T) & (j[None, :] < S)
    if CAUSAL:
        keep = keep & (j[None, :] <= i[:, None])
    p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
    return p, p * (tl.dot(do, tl.trans(v)) - delta[:, None])  # dP = dO V^T


@triton.jit
def flash_backward_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, T, S, scale, BLOCK_Q: tl.constexpr,
                               BLOCK_K: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr):
    j = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)  # the key rows of this program
    tq, tk = tl.program_id(1) * T, tl.program_id(1) * S  # first query and key row of this (batch, head)
    k, v = _load_rows(K + tk * D, j, S, D), _load_rows(V + tk * D, j, S, D)  # (BLOCK_K, D) each
    dk = tl.zeros([BLOCK_K, D], tl.float32)
    dv = tl.zeros([BLOCK_K, D], tl.float32)
    start = 0
    if CAUSAL:  # query blocks that end before the first key of this block never see it
        start = (tl.program_id(0) * BLOCK_K) // BLOCK_Q * BLOCK_Q
    for i0 in range(start, T, BLOCK_Q):
        i = i0 + tl.arange(0, BLOCK_Q)  # the query rows of this tile
        q, do, lse, delta = _query_block(Q + tq * D, DO + tq * D, LSE + tq, DELTA + tq, i, T, D)
        p, ds = _weights_and_ds(q, k, v, do, lse, delta, i, j, T, S, scale, CAUSAL)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)  # dV_j += P^T dO_i
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)  # dK_j += dS^T Q_i (times scale below)
    _store_rows(DK + tk * D, j, S, D, dk * scale)
    _store_rows(DV + tk * D, j, S, D, dv)


@triton.jit
def flash_backward_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, T, S, scale, BLOCK_Q: tl.constexpr,
                             BLOCK_K: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr):
    i = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # the query rows of this program
    tq, tk = tl.program_id(1) * T, tl.program_id(1) * S  # first query and key row of this (batch, head)
    q, do, lse, delta = _query_block(Q + tq * D, DO + tq * D, LSE + tq, DELTA + tq, i, T, D)
    dq = tl.zeros([BLOCK_Q, D], tl.float32)
    end = S
    if CAUSAL:  # key blocks that start after the last query of this block are never seen
        end = tl.minimum((tl.program_id(0) + 1) * BLOCK_Q, S)
    for j0 in range(0, end, BLOCK_K):
        j = j0 + tl.arange(0, BLOCK_K)  # the key rows of this tile
        k = _load_rows(K + tk * D, j, S, D)  # (BLOCK_K, D)
        _, ds = _weights_and_ds(q, k, _load_rows(V + tk * D, j, S, D), do, lse, delta, i, j, T, S, scale, CAUSAL)
        dq += tl.dot(ds.to(k.dtype), k)  # dQ_i += dS K_j (times scale below)
    _store_rows(DQ + tq * D, i, T, D, dq * scale)
