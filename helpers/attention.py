"""Attention itself: stable softmax, scaled dot-product, additive and multi-head attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers._validate import check_bool_mask, require_tensor, shape_str


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax that subtracts the max first (lesson 03); an all -inf row gives zeros."""
    require_tensor(x, "x", floating=True)
    row_max = x.amax(dim=dim, keepdim=True)
    # An all -inf row has max -inf and -inf - (-inf) = nan: shift such rows by 0 instead.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(x - row_max)
    # Every row that is not all -inf sums to >= 1 (its max contributes exp(0)); an all -inf row
    # sums to 0 and is divided by `tiny`, giving zeros instead of 0/0 = nan.
    return e / e.sum(dim=dim, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p: float = 0.0):
    """softmax(q k^T / sqrt(D)) v with a boolean mask, True = may attend (lesson 02; masks: 05).

    q (..., T, D), k (..., S, D), v (..., S, Dv); mask broadcastable to (..., T, S).
    Returns (out (..., T, Dv), weights (..., T, S)). A fully masked row gives zero weights and a
    zero output row, never NaN. ``weights`` are the ones applied to v (after dropout, if any).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(t, name, floating=True, min_dim=2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same width D: q is {shape_str(q.shape)} (D={q.shape[-1]}), "
            f"k is {shape_str(k.shape)} (D={k.shape[-1]})"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length S: k is {shape_str(k.shape)}, "
            f"v is {shape_str(v.shape)}"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    if mask is not None:
        check_bool_mask(mask, scores.shape)
        scores = scores.masked_fill(~mask, float("-inf"))  # blocked pairs get exp(-inf) = 0
    weights = softmax(scores, dim=-1)  # (..., T, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights  # (..., T, Dv), (..., T, S)


class AdditiveAttention(nn.Module):
    """Bahdanau et al. 2015 scoring: score(q, k) = v^T tanh(W_q q + W_k k) (lesson 01)."""

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__()
        self.w_q = nn.Linear(query_dim, hidden_dim, bias=False)
        self.w_k = nn.Linear(key_dim, hidden_dim, bias=True)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, query, keys, values=None, mask=None):
        """query (B, T, Dq), keys (B, S, Dk), values (B, S, Dv) (default: keys), mask -> (B, T, S).

        Returns (context (B, T, Dv), weights (B, T, S)); mask is boolean, True = may attend.
        """
        values = keys if values is None else values
        require_tensor(query, "query", floating=True, min_dim=3)
        require_tensor(keys, "keys", floating=True, min_dim=3)
        if query.shape[-1] != self.w_q.in_features or keys.shape[-1] != self.w_k.in_features:
            raise ValueError(
                f"expected query (..., {self.w_q.in_features}) and keys (..., "
                f"{self.w_k.in_features}), got {shape_str(query.shape)} and {shape_str(keys.shape)}"
            )
        # (B, T, 1, hidden) + (B, 1, S, hidden) -> (B, T, S, hidden) -> (B, T, S)
        hidden = torch.tanh(self.w_q(query).unsqueeze(-2) + self.w_k(keys).unsqueeze(-3))
        scores = self.v(hidden).squeeze(-1)  # (B, T, S)
        if mask is not None:
            check_bool_mask(mask, scores.shape, "(B, T, S)")
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = softmax(scores, dim=-1)  # (B, T, S)
        return weights @ values, weights  # (B, T, Dv), (B, T, S)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017 section 3.2.2 (lesson 04).

    ``forward(query (B, T, C), key (B, S, C), value (B, S, C), mask)`` returns
    (out (B, T, C), weights (B, H, T, S)); mask is boolean, broadcastable to (B, H, T, S),
    True = may attend.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_model <= 0 or n_heads <= 0:
            raise ValueError(f"d_model and n_heads must be positive, got {d_model} and {n_heads}")
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}: each head gets "
                f"d_model / n_heads = {d_model / n_heads:g} features, which must be a whole number"
            )
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, L, C = x.shape
        # view as (B, L, H, D) first: the H*D features of a position stay together
        return x.view(B, L, self.n_heads, self.head_dim).transpose(1, 2)  # (B, L, C) -> (B, H, L, D)

    def forward(self, query, key, value, mask=None):
        for name, t in (("query", query), ("key", key), ("value", value)):
            require_tensor(t, name, floating=True)
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must have shape (B, L, d_model={self.d_model}), "
                    f"got {shape_str(t.shape)}"
                )
        if key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(
                "query (B, T, C), key (B, S, C) and value (B, S, C) must agree on B and S: got "
                f"{shape_str(query.shape)}, {shape_str(key.shape)}, {shape_str(value.shape)}"
            )
        B, T, C = query.shape
        S = key.shape[1]
        if mask is not None:
            check_bool_mask(mask, (B, self.n_heads, T, S), "(B, H, T, S)")
        # 1) project, then split into heads
        q = self._split_heads(self.w_q(query))  # (B, H, T, D)
        k = self._split_heads(self.w_k(key))  # (B, H, S, D)
        v = self._split_heads(self.w_v(value))  # (B, H, S, D)
        # 2) attend in every head at once
        p = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)
        # 3) concatenate the heads and mix them with W_O
        out = out.transpose(1, 2).contiguous().view(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.w_o(out), weights  # (B, T, C), (B, H, T, S)
