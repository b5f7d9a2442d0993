"""Attention itself: stable softmax, scaled dot-product, additive and multi-head attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers._validate import (
    check_additive_inputs,
    check_bool_mask,
    check_mha_inputs,
    check_qkv,
    positive_int,
    probability,
    require_tensor,
    shape_str,
)

_HALF = (torch.float16, torch.bfloat16)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax that subtracts the max first (lesson 03); an all -inf row gives zeros."""
    require_tensor(x, "x", floating=True)
    if x.dim() > 0 and x.size(dim) == 0:
        raise ValueError(f"softmax over an empty dimension is undefined: x has shape {shape_str(x.shape)}, "
                         f"and dim={dim} has size 0")
    row_max = x.amax(dim=dim, keepdim=True)
    # An all -inf row has max -inf and -inf - (-inf) = nan: shift such rows by 0 instead.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(x - row_max)
    # Every row that is not all -inf sums to >= 1 (its max contributes exp(0)); an all -inf row
    # sums to 0 and is divided by `tiny`, giving zeros instead of 0/0 = nan.
    return e / e.sum(dim=dim, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)


def _zero_unread_values(v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k or v (..., S, D) with the rows of keys that no query may read set to 0, so NaN padding cannot leak."""
    read = (mask.any(dim=-2) if mask.dim() > 1 else mask)[..., None]  # (..., T, S) -> (..., S, 1)
    return torch.where(read, v, torch.zeros((), dtype=v.dtype, device=v.device))


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p: float = 0.0):
    """softmax(q k^T / sqrt(D)) v with a boolean mask, True = may attend (lesson 02; masks: 05).

    q (..., T, D), k (..., S, D), v (..., S, Dv); mask broadcastable to (..., T, S), on the device of q.
    Returns (out (..., T, Dv), weights (..., T, S)). A fully masked row gives zero weights and a
    zero output row, never NaN. A key that every query is masked from (padding) may hold NaN or
    inf: it reaches no output. ``weights`` are the ones applied to v (after dropout, if any).
    float16/bfloat16 inputs are scored, softmaxed and summed in float32 (as PyTorch's math path
    does), so scores beyond 65504 do not overflow; out and weights come back in the input dtype.
    """
    check_qkv(q, k, v, mask, dropout_p)
    dtype = q.dtype
    if dtype in _HALF:
        q, k, v = q.float(), k.float(), v.float()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # blocked pairs get exp(-inf) = 0
        v = _zero_unread_values(v, mask)  # 0 * NaN = NaN: a value row nobody reads becomes 0
    weights = softmax(scores, dim=-1)  # (..., T, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return (weights @ v).to(dtype), weights.to(dtype)  # (..., T, Dv), (..., T, S)


def _fused_attention(q, k, v, mask=None, dropout_p: float = 0.0) -> torch.Tensor:
    """The output of ``scaled_dot_product_attention`` from PyTorch's fused kernel, without the weights.

    Same mask polarity (True = may attend); a fully masked row gives a zero row instead of the
    kernel's NaN, and keys nobody reads may hold NaN, as in the weights path (the kernel adds the
    mask as -inf, and NaN - inf is NaN, so their key rows are zeroed too).
    """
    check_qkv(q, k, v, mask, dropout_p)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1): rows with at least one key to read
    # a fully masked row is let read every key (so the kernel stays finite), then set to 0
    k, v = _zero_unread_values(k, mask), _zero_unread_values(v, mask)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key, dropout_p=dropout_p)  # (..., T, Dv)
    return torch.where(has_key, out, torch.zeros((), dtype=out.dtype, device=out.device))


class AdditiveAttention(nn.Module):
    """Bahdanau et al. 2015 scoring: score(q, k) = v^T tanh(W_q q + W_k k) (lesson 01)."""

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__()
        query_dim, key_dim = positive_int(query_dim, "query_dim"), positive_int(key_dim, "key_dim")
        hidden_dim = positive_int(hidden_dim, "hidden_dim")
        self.w_q = nn.Linear(query_dim, hidden_dim, bias=False)
        self.w_k = nn.Linear(key_dim, hidden_dim, bias=True)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, query, keys, values=None, mask=None):
        """query (B, T, Dq), keys (B, S, Dk), values (B, S, Dv) (default: keys), mask -> (B, T, S).

        Returns (context (B, T, Dv), weights (B, T, S)); mask is boolean, True = may attend.
        """
        values = keys if values is None else values
        check_additive_inputs(self, query, keys, values)
        # (B, T, 1, hidden) + (B, 1, S, hidden) -> (B, T, S, hidden) -> (B, T, S)
        hidden = torch.tanh(self.w_q(query).unsqueeze(-2) + self.w_k(keys).unsqueeze(-3))
        scores = self.v(hidden).squeeze(-1)  # (B, T, S)
        if mask is not None:
            check_bool_mask(mask, scores.shape, "(B, T, S)", device=query.device, like="query")
            scores = scores.masked_fill(~mask, float("-inf"))
            values = _zero_unread_values(values, mask)  # padding may hold NaN: nobody reads it
        weights = softmax(scores, dim=-1)  # (B, T, S)
        return weights @ values, weights  # (B, T, Dv), (B, T, S)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017 section 3.2.2 (lesson 04).

    ``forward(query (B, T, C), key (B, S, C), value (B, S, C), mask, need_weights)`` returns
    (out (B, T, C), weights (B, H, T, S), or None when need_weights=False). The mask is boolean,
    True = may attend, and either 2-D, exactly (T, S) (such as ``causal_mask(T)``), shared by every
    batch item and head, or 4-D, broadcastable to (B, H, T, S): a key-padding mask is
    (B, 1, 1, S), from ``helpers.masks.padding_mask``. A 2-D (B, S) mask is never read as key
    padding: it is rejected, and when B == T > 1 every 2-D mask is rejected, since its meaning would
    then depend on the sizes (give it 4-D: ``mask[None, None]``).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        d_model, n_heads = positive_int(d_model, "d_model"), positive_int(n_heads, "n_heads")
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}: each head gets "
                f"d_model / n_heads = {d_model / n_heads:g} features, which must be a whole number"
            )
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = nn.Dropout(probability(dropout, "dropout"))  # on the attention weights
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, L, C = x.shape
        # view as (B, L, H, D) first: the H*D features of a position stay together
        return x.view(B, L, self.n_heads, self.head_dim).transpose(1, 2)  # (B, L, C) -> (B, H, L, D)

    def forward(self, query, key, value, mask=None, need_weights: bool = True):
        check_mha_inputs(self, query, key, value, mask, need_weights)
        B, T, C = query.shape
        # 1) project, then split into heads
        q = self._split_heads(self.w_q(query))  # (B, H, T, D)
        k = self._split_heads(self.w_k(key))  # (B, H, S, D)
        v = self._split_heads(self.w_v(value))  # (B, H, S, D)
        # 2) attend in every head at once: with the weights, or in PyTorch's fused kernel without
        p = self.dropout.p if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)
        else:
            out, weights = _fused_attention(q, k, v, mask=mask, dropout_p=p), None
        # 3) concatenate the heads and mix them with W_O
        out = out.transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.w_o(out), weights  # (B, T, C), (B, H, T, S) or None


@torch.no_grad()
def to_torch_mha(module: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention`` (batch_first) with the weights of ``module`` copied in (lesson 04).

    PyTorch stacks W_Q, W_K, W_V into one (3C, C) ``in_proj_weight``; W_O is its ``out_proj``.
    Same dtype and device as ``module``; its dropout rate and train/eval mode are carried over.
    """
    if not isinstance(module, MultiHeadAttention):
        raise TypeError(f"module must be a helpers.attention.MultiHeadAttention, got {type(module).__name__}")
    w = module.w_q.weight
    bias = module.w_q.bias is not None
    theirs = nn.MultiheadAttention(module.d_model, module.n_heads, dropout=module.dropout.p, bias=bias,
                                   batch_first=True, device=w.device, dtype=w.dtype)
    theirs.in_proj_weight.copy_(torch.cat([module.w_q.weight, module.w_k.weight, module.w_v.weight]))  # (3C, C)
    theirs.out_proj.weight.copy_(module.w_o.weight)  # (C, C)
    if bias:
        theirs.in_proj_bias.copy_(torch.cat([module.w_q.bias, module.w_k.bias, module.w_v.bias]))  # (3C,)
        theirs.out_proj.bias.copy_(module.w_o.bias)  # (C,)
    return theirs.train(module.training)
