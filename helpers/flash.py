"""FlashAttention from scratch: attention tiled over query and key blocks with an online softmax (lesson 10).

The forward of Dao et al. 2022 (Algorithm 1), written with PyTorch tensors: every block of
queries keeps a running maximum ``m``, a running sum ``l`` and an output accumulator, so no
(T, S) matrix is ever held, only (block_q, block_k) tiles. The row log-sum-exp is returned
too, which is all the backward (FlashAttention-2, Dao 2023, Algorithm 2) needs to recompute any
tile of weights; ``FlashAttentionFunction`` joins the two for autograd.
"""

from __future__ import annotations

import math
import os

import torch
from torch.autograd.function import once_differentiable

from helpers._validate import (
    check_bool_mask,
    check_same_kind,
    check_width_and_length,
    positive_int,
    require_tensor,
    shape_str,
)


def _check_inputs(q, k, v, mask, block_q, block_k) -> tuple[int, int]:
    """Raise a clear error for bad q, k, v, mask or block sizes; return the block sizes as ints."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(t, name, floating=True, dim=4, what="(B, H, L, D) with 4 dimensions")
    check_same_kind("q, k and v", q, k, v)
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            "q (B, H, T, D), k (B, H, S, D) and v (B, H, S, D) must agree on B and H: got "
            f"{shape_str(q.shape)}, {shape_str(k.shape)}, {shape_str(v.shape)}"
        )
    check_width_and_length(q, k, v)
    if q.shape[2] == 0 or k.shape[2] == 0 or q.shape[-1] == 0:
        raise ValueError(f"T, S and D must be at least 1, got q {shape_str(q.shape)} and k {shape_str(k.shape)}")
    block_q, block_k = positive_int(block_q, "block_q"), positive_int(block_k, "block_k")
    if mask is not None:
        B, H, T, _ = q.shape
        check_bool_mask(mask, (B, H, T, k.shape[2]), "(B, H, T, S)", device=q.device)
    return block_q, block_k


def _expand_mask(mask, B, H, T, S):
    """(mask as a (B, H, T, S) view, read (B, H, S): may some query read key j?), or (None, None) without a mask."""
    if mask is None:
        return None, None
    read = mask.any(dim=-2) if mask.dim() > 1 else mask  # (..., S): one number per key, no (T, S) copy
    return mask.expand(B, H, T, S), read.expand(B, H, S)


def _tile(x, read, j0, j1, work):
    """Rows j0:j1 of k or v in the working dtype; keys no query may read are set to 0 (NaN padding cannot leak)."""
    x_j = x[:, :, j0:j1].to(work)  # (B, H, bk, D)
    if read is None:
        return x_j
    return torch.where(read[:, :, j0:j1, None], x_j, torch.zeros((), dtype=work, device=x.device))


def flash_attention_forward(q, k, v, mask=None, block_q: int = 64, block_k: int = 64):
    """Tiled attention with an online softmax; returns (out (B, H, T, Dv), lse (B, H, T)) (lesson 10).

    ``lse`` is the log-sum-exp of each row of scaled scores, -inf for a fully masked row. The
    arithmetic runs in float32 for half-precision inputs and in the inputs' dtype otherwise.
    """
    block_q, block_k = _check_inputs(q, k, v, mask, block_q, block_k)
    B, H, T, D = q.shape
    S, Dv = k.shape[2], v.shape[3]
    work = torch.promote_types(q.dtype, torch.float32)  # accumulate fp16/bf16 in float32
    scale = 1.0 / math.sqrt(D)
    full_mask, read = _expand_mask(mask, B, H, T, S)
    out = torch.empty(B, H, T, Dv, dtype=q.dtype, device=q.device)  # (B, H, T, Dv)
    lse = torch.empty(B, H, T, dtype=work, device=q.device)  # (B, H, T)
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        q_i = q[:, :, i0:i1].to(work) * scale  # (B, H, bq, D)
        m = torch.full((B, H, i1 - i0, 1), float("-inf"), dtype=work, device=q.device)  # running max
        l_sum = torch.zeros(B, H, i1 - i0, 1, dtype=work, device=q.device)  # running sum of exp
        acc = torch.zeros(B, H, i1 - i0, Dv, dtype=work, device=q.device)  # running sum of exp * v
        for j0 in range(0, S, block_k):
            j1 = min(j0 + block_k, S)
            s = q_i @ _tile(k, read, j0, j1, work).transpose(-2, -1)  # (B, H, bq, bk)
            if full_mask is not None:
                s = s.masked_fill(~full_mask[:, :, i0:i1, j0:j1], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (B, H, bq, 1)
            # Rows with nothing unmasked so far have max -inf: shift them by 0, not by -inf (nan).
            shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            p = torch.exp(s - shift)  # (B, H, bq, bk); masked entries give exp(-inf) = 0
            rescale = torch.exp(m - shift)  # (B, H, bq, 1): exp(old max - new max) <= 1
            l_sum = rescale * l_sum + p.sum(dim=-1, keepdim=True)
            acc = rescale * acc + p @ _tile(v, read, j0, j1, work)  # (B, H, bq, Dv); 0 * NaN cannot occur
            m = m_new
        # A fully masked row has l_sum = 0 and acc = 0: dividing by `tiny` gives 0, not 0/0.
        out[:, :, i0:i1] = (acc / l_sum.clamp_min(torch.finfo(work).tiny)).to(q.dtype)
        lse[:, :, i0:i1] = (m + torch.log(l_sum)).squeeze(-1)  # -inf + log(0) = -inf when fully masked
    return out, lse


def _check_saved(q, v, out, lse, grad_out) -> None:
    B, H, T, _ = q.shape
    expected = {"out": (B, H, T, v.shape[3]), "lse": (B, H, T), "grad_out": (B, H, T, v.shape[3])}
    for name, t in (("out", out), ("lse", lse), ("grad_out", grad_out)):
        require_tensor(t, name, floating=True)
        if tuple(t.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {shape_str(expected[name])} for q {shape_str(q.shape)} and "
                             f"v {shape_str(v.shape)}, got {shape_str(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def flash_attention_backward(q, k, v, out, lse, grad_out, mask=None, block_q: int = 64, block_k: int = 64):
    """(dq, dk, dv) of flash_attention from its saved out and lse, tile by tile (FlashAttention-2, Alg. 2) (lesson 10).

    Each (block_q, block_k) tile of weights is recomputed as exp(s - lse); D_i = rowsum(dO * O)
    replaces rowsum(P * dP); no (T, S) matrix is held. The outer loop runs over key blocks, which
    own dk and dv; dq is accumulated across them. A fully masked row (lse = -inf) and a key that
    no query may read get zero gradients. Same dtype rules as ``flash_attention_forward``.
    """
    block_q, block_k = _check_inputs(q, k, v, mask, block_q, block_k)
    _check_saved(q, v, out, lse, grad_out)
    B, H, T, D = q.shape
    S = k.shape[2]
    work = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(D)
    full_mask, read = _expand_mask(mask, B, H, T, S)
    delta = (grad_out.to(work) * out.to(work)).sum(dim=-1, keepdim=True)  # (B, H, T, 1): D_i = dO_i . O_i
    # A fully masked row has lse = -inf and scores -inf: exp(-inf - (+inf)) = 0, where -inf - (-inf) is NaN.
    lse = torch.where(lse == float("-inf"), float("inf"), lse.to(work)).unsqueeze(-1)  # (B, H, T, 1)
    dq = torch.zeros(B, H, T, D, dtype=work, device=q.device)  # (B, H, T, D), summed over key blocks
    dk, dv = torch.empty_like(k), torch.empty_like(v)  # (B, H, S, D), (B, H, S, Dv)
    for j0 in range(0, S, block_k):
        j1 = min(j0 + block_k, S)
        k_j, v_j = _tile(k, read, j0, j1, work), _tile(v, read, j0, j1, work)  # (B, H, bk, D), (B, H, bk, Dv)
        dk_j = torch.zeros_like(k_j)  # (B, H, bk, D)
        dv_j = torch.zeros_like(v_j)  # (B, H, bk, Dv)
        for i0 in range(0, T, block_q):
            i1 = min(i0 + block_q, T)
            q_i, do_i = q[:, :, i0:i1].to(work), grad_out[:, :, i0:i1].to(work)  # (B, H, bq, D), (B, H, bq, Dv)
            # a query that reads nothing (lse = -inf, stored as +inf) gets dS = 0, but 0 * NaN = NaN in
            # dK = dS^T Q: its row of the tile is zeroed
            q_i = q_i.masked_fill(torch.isinf(lse[:, :, i0:i1]), 0.0)  # (B, H, bq, D)
            s = (q_i @ k_j.transpose(-2, -1)) * scale  # (B, H, bq, bk)
            if full_mask is not None:
                s = s.masked_fill(~full_mask[:, :, i0:i1, j0:j1], float("-inf"))
            p = torch.exp(s - lse[:, :, i0:i1])  # (B, H, bq, bk): the forward's weights, recomputed
            dv_j += p.transpose(-2, -1) @ do_i  # dV = P^T dO
            dp = do_i @ v_j.transpose(-2, -1)  # (B, H, bq, bk): dP = dO V^T
            ds = p * (dp - delta[:, :, i0:i1])  # (B, H, bq, bk): dS = P * (dP - D_i)
            dq[:, :, i0:i1] += (ds @ k_j) * scale  # dQ = dS K / sqrt(D)
            dk_j += (ds.transpose(-2, -1) @ q_i) * scale  # dK = dS^T Q / sqrt(D)
        dk[:, :, j0:j1], dv[:, :, j0:j1] = dk_j, dv_j  # cast to the inputs' dtype
    return dq.to(q.dtype), dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """flash_attention for autograd: the tiled forward, and the tiled backward from the saved lse (lesson 10).

    ``FlashAttentionFunction.apply(q, k, v, mask, block_q, block_k)``; the mask and block sizes get
    no gradient. It saves q, k, v, out and lse (no (T, S) matrix); it has no second derivative.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, block_q, block_k):
        out, lse = flash_attention_forward(q, k, v, mask=mask, block_q=block_q, block_k=block_k)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.blocks = (block_q, block_k)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, mask, *ctx.blocks)
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, mask=None, block_q: int = 64, block_k: int = 64) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v computed block by block, never holding a (T, S) matrix (lesson 10).

    q (B, H, T, D), k (B, H, S, D), v (B, H, S, Dv); mask boolean, broadcastable to
    (B, H, T, S), True = may attend. What it gives where PyTorch's SDPA gives NaN: a fully masked
    row gives a zero output row and zero gradients; a key that no query may read (padding) may
    hold NaN or inf, and reaches no output and no gradient (as lesson 02's attention). NaN or
    inf in a key that some query reads propagates, as in SDPA. Differentiable through
    ``FlashAttentionFunction`` (the tiled backward); block sizes are positive integers.
    """
    return FlashAttentionFunction.apply(q, k, v, mask, block_q, block_k)


# --- the same forward, and the backward, as Triton kernels (lesson 10, section 5) --------------------

LOG2_E = 1.4426950408889634  # exp(x) = 2 ** (x * log2(e)); GPUs compute 2 ** x in one instruction


def _triton_kernel(name: str = "flash_forward_kernel"):
    """A kernel of helpers._flash_triton, imported on first use: importing helpers.flash never needs Triton."""
    import helpers._flash_triton as kernels

    return getattr(kernels, name)


def triton_block_sizes(device=None) -> tuple[int, int, int]:
    """(block_q, block_k, num_warps) for the Triton kernel on a CUDA device (lesson 10).

    128 x 64 tiles and 8 warps where the GPU has the on-chip memory for them (compute capability
    8 and later: A100, H100, L4), 64 x 32 and 4 warps before (T4, V100), so that the tiles of a
    D = 128 head fit. Without CUDA (Triton's interpreter) the small setting.
    """
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available()
                                                                          else "cpu")
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8:
        return 128, 64, 8
    return 64, 32, 4


def _triton_setup(q, k, v, causal, block_q, block_k, num_warps) -> tuple[int, int, int]:
    """Check what the Triton kernels can do; return (block_q, block_k, num_warps) with the defaults filled in."""
    default_q, default_k, default_warps = triton_block_sizes(q.device if isinstance(q, torch.Tensor) else None)
    block_q = default_q if block_q is None else block_q
    block_k = default_k if block_k is None else block_k
    num_warps = default_warps if num_warps is None else num_warps
    block_q, block_k = _check_inputs(q, k, v, None, block_q, block_k)
    T, D, S = q.shape[2], q.shape[3], k.shape[2]
    if v.shape[-1] != D:
        raise ValueError(f"the Triton kernel needs v as wide as q: q is {shape_str(q.shape)}, v {shape_str(v.shape)}")
    for name, n in (("D", D), ("block_q", block_q), ("block_k", block_k)):  # tl.dot works on such tiles
        if n < 16 or n & (n - 1):
            raise ValueError(f"{name} must be a power of two >= 16 for the Triton kernel, got {n}")
    if causal and T != S:
        raise ValueError(f"causal needs T == S (self-attention), got T={T} and S={S}")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"Triton kernels run on CUDA tensors, got {q.device}; on the CPU set the environment "
                         "variable TRITON_INTERPRET=1 before Triton is imported to use its interpreter")
    return block_q, block_k, positive_int(num_warps, "num_warps")


def triton_flash_attention(q, k, v, causal: bool = False, block_q: int | None = None, block_k: int | None = None,
                           num_warps: int | None = None) -> torch.Tensor:
    """The forward of flash_attention as a Triton kernel, no mask or causal (lesson 10).

    q (B, H, T, D), k and v (B, H, S, D) on a CUDA GPU, in fp16/bf16 (fp32 works too); D a power
    of two >= 16; block sizes and warps default to ``triton_block_sizes(q.device)``. On CPU
    tensors it runs only in Triton's interpreter (TRITON_INTERPRET=1 set before Triton is first
    imported), whose tl.dot is wrong for bf16 in Triton 3.9: use fp16 or fp32 there.
    """
    block_q, block_k, num_warps = _triton_setup(q, k, v, causal, block_q, block_k, num_warps)
    import triton

    B, H, T, D = q.shape
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)  # (B, H, T, D)
    grid = (triton.cdiv(T, block_q), B * H)  # one program per block of queries, per (batch, head)
    _triton_kernel()[grid](q, k, v, out, T, k.shape[2], LOG2_E / math.sqrt(D), BLOCK_Q=block_q, BLOCK_K=block_k,
                           D=D, CAUSAL=bool(causal), num_warps=num_warps)
    return out


def triton_flash_attention_backward(q, k, v, out, lse, grad_out, causal: bool = False, block_q: int | None = None,
                                    block_k: int | None = None, num_warps: int | None = None):
    """(dq, dk, dv) of attention as two Triton kernels, a dK/dV pass and a dQ pass (FlashAttention-2) (lesson 10).

    The inputs of ``flash_attention_backward`` (lse as ``flash_attention_forward`` returns it), no
    mask or causal; the same devices, dtypes and sizes as ``triton_flash_attention``. Its speed on
    an H100 is in benchmarks/results/flash_cs336_cuda.md (forward + backward against SDPA's kernels).

    Without ``block_q``, heads wider than 64 get 64-query blocks: on an H100 (2026-11-27) the
    forward's 128 x 64 tiles at D = 128 asked the dK/dV kernel for 247,808 bytes of shared memory,
    more than the 232,448 the GPU has per block, and Triton refused to launch it.
    """
    if block_q is None and isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[-1] > 64:
        block_q = min(64, triton_block_sizes(q.device)[0])  # a wide head: half the tile, so it fits on chip
    block_q, block_k, num_warps = _triton_setup(q, k, v, causal, block_q, block_k, num_warps)
    _check_saved(q, v, out, lse, grad_out)
    import triton

    B, H, T, D = q.shape
    S = k.shape[2]
    q, k, v, grad_out = q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous()
    lse = lse.float().contiguous()  # (B, H, T)
    delta = (grad_out.float() * out.float()).sum(dim=-1).contiguous()  # (B, H, T): D_i = dO_i . O_i
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sizes = dict(BLOCK_Q=block_q, BLOCK_K=block_k, D=D, CAUSAL=bool(causal), num_warps=num_warps)
    scale = 1.0 / math.sqrt(D)
    _triton_kernel("flash_backward_dkdv_kernel")[(triton.cdiv(S, block_k), B * H)](
        q, k, v, grad_out, lse, delta, dk, dv, T, S, scale, **sizes)  # one program per block of keys
    _triton_kernel("flash_backward_dq_kernel")[(triton.cdiv(T, block_q), B * H)](
        q, k, v, grad_out, lse, delta, dq, T, S, scale, **sizes)  # one program per block of queries
    return dq, dk, dv
