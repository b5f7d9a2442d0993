"""Lesson 10's FlashAttention forward as a Triton kernel, in its own module (lesson 10).

Imported only by ``helpers.flash.triton_flash_attention``, so that importing ``helpers.flash`` never
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
