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
    check_mha_mask,
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

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 n_kv_heads: int | None = None):
        super().__init__()
        d_model, n_heads = positive_int(d_model, "d_model"), positive_int(n_heads, "n_heads")
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}: each head gets "
                f"d_model / n_heads = {d_model / n_heads:g} features, which must be a whole number"
            )
        n_kv_heads = n_heads if n_kv_heads is None else positive_int(n_kv_heads, "n_kv_heads")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}: each group of "
                             "query heads must share one key/value head")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.n_kv_heads = n_kv_heads
        self.dropout = nn.Dropout(probability(dropout, "dropout"))  # on the attention weights
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: torch.Tensor, n_heads: int | None = None) -> torch.Tensor:
        B, L, _ = x.shape
        H = self.n_heads if n_heads is None else n_heads
        # view as (B, L, H, D) first: the H*D features of a position stay together
        return x.view(B, L, H, self.head_dim).transpose(1, 2)  # (B, L, H*D) -> (B, H, L, D)

    def new_cache(self, batch: int, max_len: int, dtype=None, device=None) -> KVCache:
        """An empty KVCache for this module: batch rows, max_len positions (stand-in for issue 21)."""
        w = self.w_k.weight
        return KVCache(batch, self.n_kv_heads, max_len, self.head_dim,
                       dtype=w.dtype if dtype is None else dtype, device=w.device if device is None else device)

    def forward(self, query, key, value, mask=None, need_weights: bool = True, cache=None):
        if cache is not None:
            return self._forward_cached(query, key, value, mask, need_weights, cache)
        check_mha_inputs(self, query, key, value, mask, need_weights)
        B, T, C = query.shape
        # 1) project, then split into heads
        q = self._split_heads(self.w_q(query))  # (B, H, T, D)
        k = self._split_heads(self.w_k(key), self.n_kv_heads)  # (B, Hkv, S, D)
        v = self._split_heads(self.w_v(value), self.n_kv_heads)  # (B, Hkv, S, D)
        return self._attend(q, k, v, mask, need_weights, B, T, C)

    def _attend(self, q, k, v, mask, need_weights, B, T, C):
        group = self.n_heads // self.n_kv_heads
        if group > 1:  # query head h reads key/value head h // group
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, S, D)
        # 2) attend in every head at once: with the weights, or in PyTorch's fused kernel without
        p = self.dropout.p if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)
        else:
            out, weights = _fused_attention(q, k, v, mask=mask, dropout_p=p), None
        # 3) concatenate the heads and mix them with W_O
        out = out.transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.w_o(out), weights  # (B, T, C), (B, H, T, S) or None

    def _forward_cached(self, query, key, value, mask, need_weights, cache):
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a helpers.attention.KVCache, got {type(cache).__name__}")
        check_mha_inputs(self, query, key, value, None, need_weights)
        B, T, C = query.shape
        T_new = key.shape[1]
        if cache.k.shape[0] != B or cache.k.shape[1] != self.n_kv_heads or cache.k.shape[3] != self.head_dim:
            raise ValueError(f"cache holds {shape_str(cache.k.shape)} but this module needs "
                             f"(B={B}, n_kv_heads={self.n_kv_heads}, max_len, head_dim={self.head_dim})")
        end = cache.length + T_new
        if end > cache.max_len:
            raise ValueError(f"the cache holds {cache.length} of max_len={cache.max_len} positions; "
                             f"{T_new} more do not fit")
        if mask is not None:
            check_mha_mask(mask, B, self.n_heads, T, end, device=query.device)
        q = self._split_heads(self.w_q(query))  # (B, H, T, D)
        cache.k[:, :, cache.length:end] = self._split_heads(self.w_k(key), self.n_kv_heads)  # (B, Hkv, T_new, D)
        cache.v[:, :, cache.length:end] = self._split_heads(self.w_v(value), self.n_kv_heads)
        cache.length = end
        k, v = cache.k[:, :, :end], cache.v[:, :, :end]  # (B, Hkv, length, D)
        return self._attend(q, k, v, mask, need_weights, B, T, C)


class KVCache:
    """Keys and values of one MultiHeadAttention, preallocated for max_len positions (stand-in for issue 21).

    k, v: (B, n_kv_heads, max_len, head_dim); ``length`` positions are stored.
    """

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, dtype=None, device=None):
        batch, max_len = positive_int(batch, "batch"), positive_int(max_len, "max_len")
        self.k = torch.zeros(batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0
        self.max_len = max_len


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
