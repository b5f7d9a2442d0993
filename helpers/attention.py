"""Attention itself: stable softmax, scaled dot-product, additive and multi-head attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers._validate import (
    check_bool_mask,
    check_heads,
    check_qkv,
    check_same_kind,
    positive_int,
    probability,
    require_bool,
    require_tensor,
    require_type,
    shape_str,
)

_HALF = (torch.float16, torch.bfloat16)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax that subtracts the max first (lesson 03); an all -inf row gives zeros.

    A row holding +inf gives its limit, where torch.softmax gives NaN: the weight is shared equally
    by its +inf entries ([0, inf, 0] -> [0, 1, 0]), and the gradient is finite. A row holding NaN
    gives NaN, as torch.softmax does. No extra (T, S) matrix is kept: attention's memory stays 3 of them.
    """
    require_tensor(x, "x", floating=True)
    if x.dim() > 0 and x.size(dim) == 0:
        raise ValueError(f"softmax over an empty dimension is undefined: x has shape {shape_str(x.shape)}, "
                         f"and dim={dim} has size 0")
    # +inf is clamped to the largest finite number: a row holding it then takes its limit (below)
    big = torch.finfo(x.dtype).max
    row_max = x.amax(dim=dim, keepdim=True).clamp(max=big)
    # An all -inf row has max -inf and -inf - (-inf) = nan: shift such rows (and NaN rows) by 0 instead.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(x.clamp(max=big) - row_max)  # a +inf entry: exp(0) = 1; a finite one: exp(x - big) = 0
    # Every row that is not all -inf sums to >= 1 (its max contributes exp(0)); an all -inf row
    # sums to 0 and is divided by `tiny`, giving zeros instead of 0/0 = nan.
    return e / e.sum(dim=dim, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)


def _zero_unread_values(v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k or v (..., S, D) with the rows of keys that no query may read set to 0, so NaN padding cannot leak."""
    read = (mask.any(dim=-2) if mask.dim() > 1 else mask)[..., None]  # (..., T, S) -> (..., S, 1)
    return torch.where(read, v, torch.zeros((), dtype=v.dtype, device=v.device))


def _zero_silent_queries(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q (..., T, D) with the rows of queries that may read no key set to 0: such a query reads nothing,
    so a NaN in it must reach no gradient (d scores is 0 there, and 0 * NaN = NaN in d k)."""
    return torch.where(mask.any(dim=-1, keepdim=True), q, torch.zeros((), dtype=q.dtype, device=q.device))


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p: float = 0.0):
    """softmax(q k^T / sqrt(D)) v with a boolean mask, True = may attend (lesson 02; masks: 05).

    q (..., T, D), k (..., S, D), v (..., S, Dv); mask broadcastable to (..., T, S), on the device of q.
    Returns (out (..., T, Dv), weights (..., T, S)). A fully masked row gives zero weights and a
    zero output row, never NaN. A key that every query is masked from (padding) may hold NaN or
    inf in k or v: it reaches no output and no gradient (its k and v rows are replaced by zeros).
    The mask follows PyTorch's rule: a 2-D mask is (T, S); any other mask has all the scores' axes
    (a key-padding mask on (B, H, T, S) is (B, 1, 1, S)); a 3-D mask on 4-D scores is refused.
    ``weights`` are the ones applied to v (after dropout, if any).
    float16/bfloat16 inputs are scored, softmaxed and summed in float32 (as PyTorch's math path
    does), so scores beyond 65504 do not overflow; out and weights come back in the input dtype.
    """
    check_qkv(q, k, v, mask, dropout_p)
    dtype = q.dtype
    if dtype in _HALF:
        q, k, v = q.float(), k.float(), v.float()
    if mask is not None:
        # 0 * NaN = NaN: the k and v rows that nobody reads become 0, or NaN padding would reach the
        # output through v, and the gradient of q through k (d scores is 0 there, times a NaN key)
        k, v = _zero_unread_values(k, mask), _zero_unread_values(v, mask)
        q = _zero_silent_queries(q, mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # blocked pairs get exp(-inf) = 0
    weights = softmax(scores, dim=-1)  # (..., T, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return (weights @ v).to(dtype), weights.to(dtype)  # (..., T, Dv), (..., T, S)


def _fused_attention(q, k, v, mask=None, dropout_p: float = 0.0) -> torch.Tensor:
    """The output of ``scaled_dot_product_attention`` from PyTorch's fused kernel, without the weights.

    Same mask polarity (True = may attend); a fully masked row gives a zero row instead of the
    kernel's NaN, and keys nobody reads may hold NaN, as in the weights path (the kernel adds the
    mask as -inf, and NaN - inf is NaN, so their key rows are zeroed too). Its caller,
    ``MultiHeadAttention.forward``, has checked q, k, v and the mask already.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1): rows with at least one key to read
    # a fully masked row is let read every key (so the kernel stays finite), then set to 0
    k, v, q = _zero_unread_values(k, mask), _zero_unread_values(v, mask), _zero_silent_queries(q, mask)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key, dropout_p=dropout_p)  # (..., T, Dv)
    return torch.where(has_key, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _check_additive_inputs(module, query, keys, values) -> None:
    """Check query (B, T, Dq), keys (B, S, Dk) and values (B, S, Dv) of additive attention against the
    module: widths, one dtype and device (the module's), B and S that agree, S >= 1."""
    query_dim, key_dim, w = module.w_q.in_features, module.w_k.in_features, module.w_q.weight
    require_tensor(query, "query", floating=True, dim=3, last=query_dim, what=f"(B, T, Dq={query_dim})")
    require_tensor(keys, "keys", floating=True, dim=3, last=key_dim, what=f"(B, S, Dk={key_dim})")
    require_tensor(values, "values", floating=True, dim=3, what="(B, S, Dv)")
    check_same_kind("query, keys and values", query, keys, values)
    if query.dtype != w.dtype or query.device != w.device:
        raise TypeError(f"query, keys and values are {query.dtype} on {query.device} but the module's weights are "
                        f"{w.dtype} on {w.device}: convert one of them, e.g. module.to(query.dtype)")
    shapes = f"{shape_str(query.shape)}, {shape_str(keys.shape)}, {shape_str(values.shape)}"
    if not query.shape[0] == keys.shape[0] == values.shape[0] or keys.shape[1] != values.shape[1]:
        raise ValueError(f"query (B, T, Dq), keys (B, S, Dk) and values (B, S, Dv) must agree on B and S: got {shapes}")
    if keys.shape[1] == 0:
        raise ValueError(f"the key length S must be >= 1 (softmax over no keys is undefined): got query, keys "
                         f"and values {shapes}")


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

        Returns (context (B, T, Dv), weights (B, T, S)); mask is boolean, True = may attend, (T, S)
        or 3-D, broadcastable to (B, T, S) (PyTorch's rule: a 2-D mask is (T, S); a key-padding mask
        is (B, 1, S)).
        """
        values = keys if values is None else values
        _check_additive_inputs(self, query, keys, values)
        # (B, T, 1, hidden) + (B, 1, S, hidden) -> (B, T, S, hidden) -> (B, T, S)
        hidden = torch.tanh(self.w_q(query).unsqueeze(-2) + self.w_k(keys).unsqueeze(-3))
        scores = self.v(hidden).squeeze(-1)  # (B, T, S)
        if mask is not None:
            check_bool_mask(mask, scores.shape, "(B, T, S)", device=query.device, like="query")
            scores = scores.masked_fill(~mask, float("-inf"))
            values = _zero_unread_values(values, mask)  # padding may hold NaN: nobody reads it
        weights = softmax(scores, dim=-1)  # (B, T, S)
        return weights @ values, weights  # (B, T, Dv), (B, T, S)


class KVCache:
    """The keys and values of ONE attention module, preallocated for max_len positions (lesson 09).

    ``k``, ``v``: (B, n_kv_heads, max_len, head_dim); ``length``: positions stored so far (an int,
    counted on the host); ``max_len``. Made by ``MultiHeadAttention.new_cache``; the module's
    ``forward(..., cache=cache)`` writes the projections of the new positions at slots
    [length, length + T_new) and attends to slots [0, length + T_new).
    ``static=True`` keeps every step's shapes fixed, so that a CUDA graph can replay it: the write
    slot is also kept on the device (``position``, a 0-d tensor), and every call attends to all
    max_len slots, so the caller's mask, (T_new, max_len), must hide the slots not written yet.
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor, static: bool = False):
        require_tensor(k, "k", floating=True, dim=4, what="(B, n_kv_heads, max_len, head_dim)")
        if v.shape != k.shape or v.dtype != k.dtype or v.device != k.device:
            raise ValueError(f"a KVCache holds keys and values of one shape, dtype and device, (B, n_kv_heads, "
                             f"max_len, head_dim): got k {shape_str(k.shape)} {k.dtype} on {k.device}, v "
                             f"{shape_str(v.shape)} {v.dtype} on {v.device}")
        self.k, self.v = k, v  # (B, n_kv_heads, max_len, head_dim) each
        self.max_len = k.shape[2]
        self.length = 0
        self.static = static
        self.position = torch.zeros((), dtype=torch.long, device=k.device)  # next slot, on the device

    def check_room(self, n_new: int) -> None:
        """Raise a ValueError unless n_new more positions fit into the max_len slots."""
        if self.length + n_new > self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} positions and {self.length} are stored: "
                             f"{n_new} more do not fit; make the cache with a larger max_len")

    def span(self, n_new: int) -> int:
        """How many slots a call that writes n_new positions attends to: length + n_new, or max_len if static."""
        return self.max_len if self.static else self.length + n_new

    def start(self):
        """The slot the next position goes to: ``length``, or the 0-d ``position`` tensor if static."""
        return self.position if self.static else self.length

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor):
        """Write k_new, v_new (B, n_kv_heads, T_new, head_dim) at the next slots; return the slots to attend to."""
        T_new = k_new.shape[2]
        self.check_room(T_new)
        if self.static:  # the slots come from the device: no value is read back to the host
            slots = self.position + torch.arange(T_new, device=self.k.device)  # (T_new,)
            self.k.index_copy_(2, slots, k_new)
            self.v.index_copy_(2, slots, v_new)
            self.position.add_(T_new)
        else:
            self.k[:, :, self.length:self.length + T_new] = k_new
            self.v[:, :, self.length:self.length + T_new] = v_new
        self.length += T_new
        end = self.span(0)
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, n_kv_heads, end, head_dim) each


def _check_mha_inputs(module, query, key, value, mask, need_weights, cache=None) -> None:
    """Check the arguments of ``MultiHeadAttention.forward`` against the module (its width, dtype,
    device) and, with a cache, against the cache (its batch size, dtype and device); key and value may then
    both be None (read the cache only)."""
    C, w = module.d_model, module.w_q.weight
    given = [("query", query)] + ([] if cache is not None and key is None and value is None
                                  else [("key", key), ("value", value)])
    for name, t in given:
        require_tensor(t, name, floating=True, dim=3, last=C, what=f"(B, L, d_model={C})")
        if t.dtype != w.dtype or t.device != w.device:
            raise TypeError(f"{name} is {t.dtype} on {t.device} but the module's weights are {w.dtype} on "
                            f"{w.device}: convert one of them, e.g. module.to({name}.dtype)")
    if len(given) == 3 and (key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]):
        raise ValueError(
            "query (B, T, C), key (B, S, C) and value (B, S, C) must agree on B and S: got "
            f"{shape_str(query.shape)}, {shape_str(key.shape)}, {shape_str(value.shape)}"
        )
    require_bool(need_weights, "need_weights")
    B, T = query.shape[:2]
    if cache is None:
        S = key.shape[1]
    else:
        S = _check_cache(module, cache, B, 0 if len(given) == 1 else key.shape[1])
    if mask is not None:
        _check_mha_mask(mask, B, module.n_heads, T, S, device=query.device)
    elif cache is not None and cache.static:
        raise ValueError(f"a static KVCache makes the queries attend to all its max_len={cache.max_len} slots, "
                         "the ones not written yet too: give a mask that hides them (helpers.masks."
                         "cached_causal_mask(cache.start(), T_new, cache.max_len))")


def _check_mha_mask(mask, B: int, H: int, T: int, S: int, device=None) -> None:
    """A multi-head mask is 2-D, exactly (T, S), shared by every batch item and head, or 4-D,
    broadcastable to (B, H, T, S), such as a (B, 1, 1, S) key-padding mask. ``device``: the query's."""
    if isinstance(mask, torch.Tensor) and mask.dim() not in (2, 4):
        raise ValueError(
            f"mask must be 2-D (T, S) = ({T}, {S}) or 4-D, broadcastable to (B, H, T, S) = "
            f"({B}, {H}, {T}, {S}); got {mask.dim()}-D {shape_str(mask.shape)}. A key-padding mask is "
            "(B, 1, 1, S): build it with helpers.masks.padding_mask(lengths, S) or mask[:, None, None, :]"
        )
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and tuple(mask.shape) != (T, S):
        raise ValueError(
            f"a 2-D mask is read as (T, S) = ({T}, {S}), one row per query, the same for every batch "
            f"item; got {shape_str(mask.shape)}. A key-padding mask (B, S) must be given as "
            "(B, 1, 1, S): helpers.masks.padding_mask(lengths, S) or mask[:, None, None, :]"
        )
    check_bool_mask(mask, (B, H, T, S), "(B, H, T, S)", device=device, like="query")


def _check_cache(module, cache, B: int, n_new: int) -> int:
    """Check that ``cache`` (a helpers.attention.KVCache) fits the module and a batch of B; return S, the
    number of slots the queries will attend to once n_new more positions are written."""
    require_type(cache, "cache", KVCache, "a helpers.attention.KVCache (from module.new_cache(batch, max_len))")
    want = (B, module.n_kv_heads, cache.max_len, module.head_dim)
    if tuple(cache.k.shape) != want or cache.k.dtype != module.w_k.weight.dtype \
            or cache.k.device != module.w_k.weight.device:
        raise ValueError(f"the cache holds keys {shape_str(cache.k.shape)} {cache.k.dtype} on {cache.k.device}, "
                         f"but this module and a batch of {B} need (B, n_kv_heads, max_len, head_dim) = "
                         f"{shape_str(want)} {module.w_k.weight.dtype} on {module.w_k.weight.device}")
    return cache.span(n_new)  # whether they fit is checked as they are written (KVCache.append)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017 section 3.2.2 (lesson 04); KV cache and GQA: lesson 09.

    ``forward(query (B, T, C), key (B, S, C), value (B, S, C), mask, need_weights, cache)`` returns
    (out (B, T, C), weights (B, H, T, S), or None when need_weights=False). The mask is boolean,
    True = may attend, under PyTorch's rule: either 2-D, exactly (T, S) (such as ``causal_mask(T)``),
    shared by every batch item and head, or 4-D, broadcastable to (B, H, T, S): a key-padding mask is
    (B, 1, 1, S) (``helpers.masks.padding_mask``). A 3-D mask is refused: aligned from the right, a
    (B, T, S) mask would put its batch axis on the heads.
    ``n_kv_heads`` (default n_heads): the number of key/value heads; each group of
    n_heads // n_kv_heads query heads reads one of them (grouped-query attention, Ainslie et al.
    2023; 1 = multi-query, Shazeer 2019). With a ``cache`` (``new_cache``), key and value are the
    new positions only, and S counts the cached slots: see ``KVCache``.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 n_kv_heads: int | None = None):
        super().__init__()
        d_model, n_heads = positive_int(d_model, "d_model"), positive_int(n_heads, "n_heads")
        n_kv_heads = n_heads if n_kv_heads is None else positive_int(n_kv_heads, "n_kv_heads")
        check_heads(d_model, n_heads, n_kv_heads)
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.n_kv_heads = n_kv_heads
        self.dropout = nn.Dropout(probability(dropout, "dropout"))  # on the attention weights
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        B, L, _ = x.shape
        # view as (B, L, H, D) first: the H*D features of a position stay together
        return x.view(B, L, n_heads, self.head_dim).transpose(1, 2)  # (B, L, H*D) -> (B, H, L, D)

    def new_cache(self, batch: int, max_len: int, dtype=None, device=None, static: bool = False) -> KVCache:
        """An empty KVCache for this module: keys and values (batch, n_kv_heads, max_len, head_dim) (lesson 09)."""
        batch, max_len = positive_int(batch, "batch"), positive_int(max_len, "max_len")
        w = self.w_k.weight
        shape = (batch, self.n_kv_heads, max_len, self.head_dim)
        k = torch.zeros(shape, dtype=dtype or w.dtype, device=device or w.device)
        return KVCache(k, torch.zeros_like(k), static=static)

    def project_kv(self, key: torch.Tensor, value: torch.Tensor):
        """Keys and values (B, n_kv_heads, S, head_dim) of key and value (B, S, C), split into heads."""
        k = self._split_heads(self.w_k(key), self.n_kv_heads)  # (B, S, C) -> (B, Hkv, S, D)
        v = self._split_heads(self.w_v(value), self.n_kv_heads)  # (B, S, C) -> (B, Hkv, S, D)
        return k, v

    def forward(self, query, key, value, mask=None, need_weights: bool = True, cache: KVCache | None = None):
        _check_mha_inputs(self, query, key, value, mask, need_weights, cache)
        B, T, C = query.shape
        # 1) project, then split into heads; with a cache, store the new keys/values and read them all
        q = self._split_heads(self.w_q(query), self.n_heads)  # (B, H, T, D)
        if cache is not None and key is None:  # read only (e.g. the encoder's memory, projected once)
            k, v = cache.k[:, :, :cache.span(0)], cache.v[:, :, :cache.span(0)]  # (B, Hkv, S, D)
        else:
            k, v = self.project_kv(key, value)  # (B, Hkv, S_new, D) each
            if cache is not None:
                k, v = cache.append(k, v)  # (B, Hkv, S, D): the cached slots, new ones included
        group = self.n_heads // self.n_kv_heads
        if group > 1:  # query head h reads key/value head h // group
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, S, D) each
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
    require_type(module, "module", MultiHeadAttention, "a helpers.attention.MultiHeadAttention")
    if module.n_kv_heads != module.n_heads:
        raise ValueError(f"nn.MultiheadAttention has one key/value head per query head; this module shares "
                         f"{module.n_kv_heads} among {module.n_heads} (grouped-query attention)")
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
