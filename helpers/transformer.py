"""The encoder-decoder Transformer of Vaswani et al. 2017 (lessons 07 and 08).

Lesson 07 derives ``TransformerConfig``, ``FeedForward`` and ``EncoderLayer``; lesson 08 derives
``DecoderLayer``, ``Encoder``, ``Decoder``, ``Transformer``, ``greedy_decode`` and ``beam_search``.
Masks follow the course's polarity everywhere: boolean, True = may attend.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from helpers._validate import (
    TOKEN_ID_DTYPES,
    as_int,
    positive_int,
    positive_ints,
    probability,
    require_tensor,
    shape_str,
)
from helpers.attention import MultiHeadAttention
from helpers.masks import cached_causal_mask, causal_mask, padding_mask_from_ids
from helpers.positional import PositionalEncoding

# --- configuration ---------------------------------------------------------------------------

# The feed-forward activations a config may name; "gelu" is the exact erf form, not the tanh approximation.
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


@dataclass(frozen=True)
class TransformerConfig:
    """Every size of the model in one frozen place; validated on creation (lesson 07)."""

    # The vocabularies are properties of the task, so they have no default.
    src_vocab_size: int  # number of source token ids, pad included; ids must lie in [0, src_vocab_size)
    tgt_vocab_size: int  # number of target token ids (the width V of the logits)
    # The remaining defaults are the 2017 paper's "base" model (Table 3) unless a comment says otherwise.
    d_model: int = 512  # width C of every residual stream; the same in and out of each block so blocks stack
    n_heads: int = 8  # heads H; 512 / 8 = 64 features per head, as in the paper (section 3.2.2)
    d_ff: int = 2048  # hidden width of the feed-forward net, 4 * d_model: room to compute per position
    n_encoder_layers: int = 6  # the paper's N = 6 identical encoder blocks
    n_decoder_layers: int = 6  # and N = 6 decoder blocks
    dropout: float = 0.1  # P_drop = 0.1 on residual branches, embeddings and attention weights
    max_len: int = 512  # longest sequence the positional table covers; longer inputs raise an error
    pad_id: int = 0  # id of the padding token in both vocabularies; positions holding it are masked
    # Pre-LN (LayerNorm inside the residual branch) trains without learning-rate warm-up and does not
    # blow up in deep stacks (Xiong et al. 2020), so it is the default here; `base()` switches back to the
    # paper's Post-LN. Lesson 07 compares the two.
    norm_first: bool = True
    # The paper's ReLU; BERT-style models (lesson 11) use the exact GELU, x * Phi(x) (Hendrycks & Gimpel 2016).
    activation: str = "relu"
    # nn.LayerNorm's default; BERT uses 1e-12, which matters when copying its weights (lesson 11).
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
                     "n_encoder_layers", "n_decoder_layers", "max_len"):
            object.__setattr__(self, name, positive_int(getattr(self, name), name))  # numpy ints become ints
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: each head gets "
                f"d_model / n_heads = {self.d_model / self.n_heads:g} features, which must be a whole number"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1), got {self.dropout!r}")
        smallest = min(self.src_vocab_size, self.tgt_vocab_size)
        object.__setattr__(self, "pad_id", as_int(self.pad_id, "pad_id (a token id of both vocabularies)",
                                                  minimum=0, maximum=smallest - 1))
        if not isinstance(self.norm_first, bool):
            raise TypeError(f"norm_first must be True (Pre-LN) or False (Post-LN), got {self.norm_first!r}")
        if not isinstance(self.activation, str) or self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < 1.0:
            raise ValueError(f"layer_norm_eps must be a small positive number in (0, 1), got {eps!r}")

    @property
    def head_dim(self) -> int:
        """Features per head, d_model / n_heads (lesson 07; the split itself is lesson 04's)."""
        return self.d_model // self.n_heads

    @classmethod
    def tiny(cls, src_vocab_size: int, tgt_vocab_size: int, **overrides) -> TransformerConfig:
        """A model small enough for unit tests to run in milliseconds (lesson 07)."""
        sizes = dict(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                     dropout=0.0, max_len=64)
        return replace(cls(src_vocab_size, tgt_vocab_size, **sizes), **overrides)

    @classmethod
    def base(cls, src_vocab_size: int, tgt_vocab_size: int, **overrides) -> TransformerConfig:
        """The paper's base model: d_model 512, 8 heads, d_ff 2048, 6 + 6 layers, Post-LN (lesson 07)."""
        sizes = dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6,
                     dropout=0.1, norm_first=False)
        return replace(cls(src_vocab_size, tgt_vocab_size, **sizes), **overrides)

    @classmethod
    def dates(cls, src_vocab_size: int, tgt_vocab_size: int, **overrides) -> TransformerConfig:
        """Lesson 08's date translator: d_model 64, 4 heads, d_ff 128, 2 + 2 layers, Pre-LN (lesson 08).

        The one source of these sizes: lesson 08 trains with them, lesson 09 and benchmarks/ time
        decoding with them. max_len 512 leaves room for long generations.
        """
        sizes = dict(d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=2,
                     dropout=0.0, max_len=512, norm_first=True)
        return replace(cls(src_vocab_size, tgt_vocab_size, **sizes), **overrides)


# --- the blocks --------------------------------------------------------------------------------


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 applied at every position alone (Vaswani et al. 2017, Eq. 2; lesson 07).

    ``activation="gelu"`` puts the exact GELU in place of max(0, .), as BERT does (lesson 11).
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        d_model, d_ff = positive_ints(d_model=d_model, d_ff=d_ff)
        dropout = probability(dropout, "dropout")
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.d_model = d_model
        self.activation = ACTIVATIONS[activation]  # ReLU in the paper; GELU in BERT (lesson 11)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)  # on the hidden units, where nn.TransformerEncoderLayer puts it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C)."""
        require_tensor(x, "x", floating=True, min_dim=1, last=self.d_model, what=f"(B, T, C={self.d_model})")
        hidden = self.activation(self.linear1(x))  # (B, T, C) -> (B, T, d_ff)
        return self.linear2(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, C)


def residual(x: torch.Tensor, sublayer, norm: nn.Module, norm_first: bool, dropout: nn.Module) -> torch.Tensor:
    """One sub-layer with its residual connection and LayerNorm, the one home of this step (lesson 07).

    Pre-LN (``norm_first=True``): x + dropout(sublayer(norm(x))).
    Post-LN (``norm_first=False``, the 2017 paper, section 5.4): norm(x + dropout(sublayer(x))).
    """
    if norm_first:
        return x + dropout(sublayer(norm(x)))
    return norm(x + dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each wrapped by ``residual``: dropout + residual + LayerNorm (lesson 07).

    Post-LN (``norm_first=False``, the 2017 paper): x = norm(x + dropout(sublayer(x))).
    Pre-LN (``norm_first=True``): x = x + dropout(sublayer(norm(x))).
    After each forward, ``attn_weights`` holds the (B, H, T, T) self-attention weights (detached).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, dropout=config.dropout)
        self.ff = FeedForward(config.d_model, config.d_ff, config.dropout, config.activation)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.attn_weights = None

    def _attend(self, x, mask):
        out, weights = self.self_attn(x, x, x, mask=mask)  # (B, T, C), (B, H, T, T)
        self.attn_weights = weights.detach()
        return out

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); mask (T, T) or 4-D, broadcastable to (B, H, T, T), True = may attend."""
        C = self.self_attn.d_model
        require_tensor(x, "x", floating=True, dim=3, last=C, what=f"(B, T, C={C})")
        x = residual(x, partial(self._attend, mask=mask), self.norm1, self.norm_first, self.dropout)  # (B, T, C)
        return residual(x, self.ff, self.norm2, self.norm_first, self.dropout)  # (B, T, C)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder's memory, feed-forward (lesson 08).

    Each sub-layer has its residual connection and LayerNorm (``norm1``, ``norm2``, ``norm3``), placed
    by ``residual`` as in ``EncoderLayer``. After each forward, ``self_attn_weights`` (B, H, T, T) and
    ``cross_attn_weights`` (B, H, T, S) hold the attention weights (detached).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, dropout=config.dropout)
        self.cross_attn = MultiHeadAttention(config.d_model, config.n_heads, dropout=config.dropout)
        self.ff = FeedForward(config.d_model, config.d_ff, config.dropout, config.activation)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.norm3 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.self_attn_weights = None
        self.cross_attn_weights = None

    def _self(self, x, mask, cache):
        out, weights = self.self_attn(x, x, x, mask=mask, cache=cache)  # (B, T, C), (B, H, T, T)
        self.self_attn_weights = weights.detach()
        return out

    def _cross(self, x, memory, mask, cache):
        if cache is not None:  # the memory's keys and values are in the cache already: read them only
            memory = None
        out, weights = self.cross_attn(x, memory, memory, mask=mask, cache=cache)  # (B, T, C), (B, H, T, S)
        self.cross_attn_weights = weights.detach()
        return out

    def forward(self, x, memory, self_mask=None, memory_mask=None, cache=None) -> torch.Tensor:
        """x (B, T, C), memory (B, S, C); masks (T, T) and (T, S) or 4-D, broadcastable to (B, H, T, T)
        and (B, H, T, S), True = may attend -> (B, T, C).

        ``cache``: None, or a pair of KVCaches (self-attention, cross-attention) from ``DecoderCache``
        (lesson 09): x holds the new positions only, the self mask covers the cached slots, and the
        cross-attention reads the memory's keys and values from its cache (memory may be None).
        """
        C = self.self_attn.d_model
        require_tensor(x, "x", floating=True, dim=3, last=C, what=f"(B, T, C={C})")
        self_cache, memory_cache = (None, None) if cache is None else cache
        x = residual(x, partial(self._self, mask=self_mask, cache=self_cache), self.norm1, self.norm_first,
                     self.dropout)  # (B, T, C)
        x = residual(x, partial(self._cross, memory=memory, mask=memory_mask, cache=memory_cache), self.norm2,
                     self.norm_first, self.dropout)  # (B, T, C)
        return residual(x, self.ff, self.norm3, self.norm_first, self.dropout)  # (B, T, C)


# --- input checks ------------------------------------------------------------------------------


def check_ids(ids, name: str, vocab_size: int, max_len: int, device: torch.device) -> None:
    """Raise a clear error unless ``ids`` is (B, L) int64/int32 token ids in [0, vocab_size), L <= max_len (lesson 08).

    ``device`` is the device of the model's embedding; the ids must be there too. Every model of the course
    (the Transformer, lesson 12's GPT) checks its ids with this one function.
    """
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype not in TOKEN_ID_DTYPES:
        narrow = ids.dtype != torch.bool and not ids.is_floating_point() and not ids.is_complex()
        raise TypeError(f"{name} must hold integer token ids of dtype torch.int64 (torch.long) or torch.int32, "
                        f"the ones nn.Embedding takes, got dtype {ids.dtype}"
                        + (f"; convert them with {name}.long()" if narrow else ""))
    if ids.device != device:
        raise ValueError(f"{name} is on {ids.device} but the model is on {device}: move the ids there with "
                         f"{name}.to({str(device)!r})")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (B, L) (a batch of id sequences), got {shape_str(ids.shape)}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one sequence of at least one token, got {shape_str(ids.shape)}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name} has length {ids.shape[1]}, longer than the model's max_len={max_len}; "
                         "build the model with a larger max_len or shorten the input")
    bad = (ids < 0) | (ids >= vocab_size)
    if bad.any():
        where = tuple(bad.nonzero()[0].tolist())
        raise ValueError(f"{name} holds token id {ids[where].item()} at position {where}, outside the "
                         f"vocabulary of size {vocab_size} (valid ids are 0..{vocab_size - 1})")


# --- encoder, decoder, model -------------------------------------------------------------------


class _Stack(nn.Module):
    """Token embedding scaled by sqrt(d_model) (section 3.4) + positional encoding; shared by both sides."""

    def __init__(self, config: TransformerConfig, vocab_size: int, layer_type, n_layers: int):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(vocab_size, config.d_model, padding_idx=config.pad_id)
        # std d_model^-0.5 so that embed * sqrt(d_model) has unit-size entries, the scale of the
        # positional encoding (the initialisation fairseq uses); the pad row stays zero
        nn.init.normal_(self.embed.weight, std=config.d_model ** -0.5)
        with torch.no_grad():
            self.embed.weight[config.pad_id].zero_()
        self.pos = PositionalEncoding(config.d_model, config.max_len, config.dropout)
        self.layers = nn.ModuleList(layer_type(config) for _ in range(n_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)  # final norm, as nn.Transformer always has

    def embed_tokens(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """(B, L) ids -> (B, L, C): embedding * sqrt(d_model) + positions from ``offset``, dropout (lesson 08)."""
        x = self.embed(ids) * math.sqrt(self.config.d_model)  # (B, L) -> (B, L, C)
        return self.pos(x, offset=offset)  # (B, L, C)


class Encoder(_Stack):
    """Embedding + positional encoding + N encoder layers + final LayerNorm (lesson 08)."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config, config.src_vocab_size, EncoderLayer, config.n_encoder_layers)

    def forward(self, src_ids: torch.Tensor, src_mask=None) -> torch.Tensor:
        """src_ids (B, S), src_mask (S, S) or 4-D, broadcastable to (B, H, S, S) -> memory (B, S, C)."""
        check_ids(src_ids, "src", self.config.src_vocab_size, self.config.max_len, self.embed.weight.device)
        x = self.embed_tokens(src_ids)  # (B, S, C)
        for layer in self.layers:
            x = layer(x, src_mask)  # (B, S, C)
        return self.norm(x)  # (B, S, C)


class DecoderCache:
    """What a Transformer keeps between decoding steps, made by ``Transformer.new_decode_cache`` (lesson 09).

    ``self_attn[i]``: the KVCache of decoder layer i's self-attention, one slot per target position;
    ``cross_attn[i]``: the KVCache of its cross-attention, holding the memory's keys and values,
    projected once; ``keep`` (B, max_len): True where a stored target token is real (not pad).
    """

    def __init__(self, self_attn: list, cross_attn: list, keep: torch.Tensor):
        self.self_attn, self.cross_attn, self.keep = self_attn, cross_attn, keep

    @property
    def length(self) -> int:
        """Target positions stored so far."""
        return self.self_attn[0].length

    @property
    def max_len(self) -> int:
        """Target positions the cache has room for."""
        return self.self_attn[0].max_len

    def layer(self, i: int):
        """The (self-attention, cross-attention) caches of decoder layer i, as DecoderLayer.forward takes them."""
        return self.self_attn[i], self.cross_attn[i]

    def self_mask(self, real: torch.Tensor) -> torch.Tensor:
        """Note which new target tokens are real, real (B, T_new); return the mask of their self-attention.

        Query j (at slot start + j) may attend to the earlier slots and its own that hold real tokens:
        (B, 1, T_new, S), S the slots the self-attention reads (``KVCache.span``).
        """
        first, T_new = self.self_attn[0], real.shape[1]
        first.check_room(T_new)
        start, S = first.start(), first.span(T_new)
        if first.static:  # the slots come from the device: no value is read back to the host
            slots = start + torch.arange(T_new, device=real.device)  # (T_new,)
            self.keep.index_copy_(1, slots, real)  # (B, T_new) into those columns of (B, max_len)
        else:
            self.keep[:, start:start + T_new] = real
        causal = cached_causal_mask(start, T_new, S, device=real.device)  # (T_new, S)
        return causal & self.keep[:, None, None, :S]  # (T_new, S) & (B, 1, 1, S) -> (B, 1, T_new, S)


class Decoder(_Stack):
    """Embedding + positional encoding + N decoder layers + final LayerNorm (lesson 08)."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config, config.tgt_vocab_size, DecoderLayer, config.n_decoder_layers)

    def forward(self, tgt_ids, memory, tgt_mask=None, memory_mask=None, cache=None) -> torch.Tensor:
        """tgt_ids (B, T), memory (B, S, C), masks (T, T) and (T, S) or 4-D, broadcastable to (B, H, T, T)
        and (B, H, T, S), True = may attend -> hidden (B, T, C).

        With a ``DecoderCache`` (lesson 09), tgt_ids are the new tokens only, placed after the cached
        ones; tgt_mask covers the cached slots (``DecoderCache.self_mask``); memory may be None.
        """
        check_ids(tgt_ids, "tgt", self.config.tgt_vocab_size, self.config.max_len, self.embed.weight.device)
        if cache is None or memory is not None:
            _check_memory(memory, tgt_ids, self.config.d_model)
        return self.hidden(tgt_ids, memory, tgt_mask, memory_mask, cache)

    def hidden(self, tgt_ids, memory, tgt_mask=None, memory_mask=None, cache=None) -> torch.Tensor:
        """``forward`` without its checks, which read the ids back from the device: a decoding loop's step."""
        offset = 0 if cache is None else cache.self_attn[0].start()
        x = self.embed_tokens(tgt_ids, offset=offset)  # (B, T, C)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, tgt_mask, memory_mask, cache=None if cache is None else cache.layer(i))  # (B, T, C)
        return self.norm(x)  # (B, T, C)


def _check_memory(memory, tgt_ids, C: int) -> None:
    """Raise a clear error unless memory is a floating (B, S, C) tensor that matches tgt_ids (B, T)."""
    if not isinstance(memory, torch.Tensor) or memory.dim() != 3 or memory.shape[-1] != C \
            or memory.shape[0] != tgt_ids.shape[0] or not memory.is_floating_point():
        got = f"{shape_str(memory.shape)} {memory.dtype}" if isinstance(memory, torch.Tensor) \
            else type(memory).__name__
        raise ValueError(f"memory must have shape (B={tgt_ids.shape[0]}, S, C={C}) and a floating dtype to "
                         f"match tgt {shape_str(tgt_ids.shape)}, got {got}")


class Transformer(nn.Module):
    """The encoder-decoder Transformer; ``forward(src (B, S), tgt (B, T)) -> logits (B, T, V)`` (lesson 08).

    Padding is handled inside: source positions holding ``pad_id`` are hidden from the encoder's
    self-attention and from the decoder's cross-attention; the decoder's self-attention is causal
    and hides target pads. ``decode`` checks its input and calls ``_decode``, the unchecked step
    that ``forward`` and the decoders of lessons 08 and 09 run (a loop checks its input once); a
    test double that writes its own next-token distribution overrides ``_decode``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.generator = nn.Linear(config.d_model, config.tgt_vocab_size)
        # Glorot/Xavier weights in every linear layer, as nn.Transformer does; zero biases are our choice
        # (nn.Transformer leaves its biases at the defaults of nn.Linear and nn.MultiheadAttention)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def encode(self, src: torch.Tensor):
        """src (B, S) -> (memory (B, S, C), src_mask (B, 1, 1, S)), the mask True at real tokens."""
        check_ids(src, "src", self.config.src_vocab_size, self.config.max_len, self.encoder.embed.weight.device)
        src_mask = padding_mask_from_ids(src, self.config.pad_id)  # (B, 1, 1, S)
        return self.encoder(src, src_mask), src_mask  # (B, S, C), (B, 1, 1, S)

    def new_decode_cache(self, memory: torch.Tensor, max_len: int, static: bool = False) -> DecoderCache:
        """An empty DecoderCache for up to max_len target positions; the memory's keys and values are
        projected once, here (lesson 09). ``static``: fixed shapes at every step (see ``KVCache``)."""
        max_len = positive_int(max_len, "max_len")
        if max_len > self.config.max_len:
            raise ValueError(f"max_len={max_len} exceeds the model's max_len={self.config.max_len}")
        require_tensor(memory, "memory", floating=True, dim=3, last=self.config.d_model,
                       what=f"(B, S, C={self.config.d_model})")
        B, S, _ = memory.shape
        self_caches, cross_caches = [], []
        for layer in self.decoder.layers:
            self_caches.append(layer.self_attn.new_cache(B, max_len, static=static))
            cross = layer.cross_attn.new_cache(B, S)
            cross.append(*layer.cross_attn.project_kv(memory, memory))  # (B, Hkv, S, D) each, once per decode
            cross_caches.append(cross)
        keep = torch.zeros(B, max_len, dtype=torch.bool, device=memory.device)  # (B, max_len)
        return DecoderCache(self_caches, cross_caches, keep)

    def decode(self, tgt: torch.Tensor, memory, src_mask=None, cache: DecoderCache | None = None) -> torch.Tensor:
        """tgt (B, T), memory (B, S, C), src_mask (B, 1, 1, S) -> logits (B, T, V); causal + target padding.

        With a ``cache`` (``new_decode_cache``, lesson 09), tgt holds the new tokens only and the
        logits are theirs; the cached positions come first, and memory may be None.
        """
        check_ids(tgt, "tgt", self.config.tgt_vocab_size, self.config.max_len, self.decoder.embed.weight.device)
        if cache is None or memory is not None:
            _check_memory(memory, tgt, self.config.d_model)
        if cache is not None:
            if not isinstance(cache, DecoderCache):
                raise TypeError(f"cache must be a DecoderCache (from model.new_decode_cache), got "
                                f"{type(cache).__name__}")
            if cache.keep.shape[0] != tgt.shape[0]:
                raise ValueError(f"the cache was made for a batch of {cache.keep.shape[0]}, tgt is "
                                 f"{shape_str(tgt.shape)}")
        return self._decode(tgt, memory, src_mask, cache)

    def _decode(self, tgt, memory, src_mask=None, cache=None) -> torch.Tensor:
        """``decode`` without its token-id checks, which read a value from the device (``bad.any()``).

        The decoders check their input once and then call this at every step; a test double that
        writes its own next-token distribution overrides this method.
        """
        if cache is None:
            # position t sees the earlier non-pad tokens: (T, T) & (B, 1, 1, T) -> (B, 1, T, T)
            tgt_mask = causal_mask(tgt.shape[1], device=tgt.device) & padding_mask_from_ids(tgt, self.config.pad_id)
        else:
            tgt_mask = cache.self_mask(tgt != self.config.pad_id)  # (B, 1, T, S_cached)
        hidden = self.decoder.hidden(tgt, memory, tgt_mask, src_mask, cache)  # (B, T, C), unchecked
        return self.generator(hidden)  # (B, T, V)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt (B, T) token ids -> logits (B, T, V) for the token after each target position."""
        check_ids(src, "src", self.config.src_vocab_size, self.config.max_len, self.encoder.embed.weight.device)
        check_ids(tgt, "tgt", self.config.tgt_vocab_size, self.config.max_len, self.decoder.embed.weight.device)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(f"src {shape_str(src.shape)} and tgt {shape_str(tgt.shape)} "
                             "must have the same batch size B")
        memory, src_mask = self.encode(src)  # (B, S, C), (B, 1, 1, S)
        return self._decode(tgt, memory, src_mask)  # (B, T, V): the ids are checked above


# --- decoding ----------------------------------------------------------------------------------


def check_decode_args(model, src, bos_id, eos_id, max_len) -> tuple[int, int, int]:
    """Raise a clear error unless the arguments of a greedy or beam decoder are valid (lesson 08);
    return bos_id, eos_id and max_len as Python ints.

    model must be a Transformer, src (B, S) its source token ids, bos_id and eos_id target token ids
    (bos_id not the pad id), and max_len an int in [2, model max_len]. Shared by every decoder.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a helpers.transformer.Transformer, got {type(model).__name__}")
    cfg = model.config
    check_ids(src, "src", cfg.src_vocab_size, cfg.max_len, model.encoder.embed.weight.device)
    bos_id, eos_id = (as_int(value, f"{name} (a target token id)", minimum=0, maximum=cfg.tgt_vocab_size - 1)
                      for name, value in (("bos_id", bos_id), ("eos_id", eos_id)))
    if bos_id == cfg.pad_id:
        raise ValueError(f"bos_id={bos_id} equals pad_id={cfg.pad_id}: the decoder would mask its own start token")
    max_len = as_int(max_len, "max_len (output length, BOS included, at most the model's max_len)", minimum=2,
                     maximum=cfg.max_len)
    return bos_id, eos_id, max_len


@torch.no_grad()
def greedy_decode(model: Transformer, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int) -> torch.Tensor:
    """Pick the most likely next token until every row has produced eos_id (lesson 08).

    Returns (B, L) ids with L <= max_len: column 0 is bos_id, and every position after a row's
    eos_id holds pad_id. (Lesson 01's RNN ``Seq2Seq.greedy_decode`` returns the generated tokens
    only, always max_len of them: no <s> column, no early stop.) The model runs in eval mode (no
    dropout) and its mode is restored after. The arguments are checked once, before the loop.
    """
    bos_id, eos_id, max_len = check_decode_args(model, src, bos_id, eos_id, max_len)
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        B = src.shape[0]
        ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        for _ in range(max_len - 1):
            next_id = model._decode(ys, memory, src_mask)[:, -1].argmax(dim=-1)  # (B, V) -> (B,)
            next_id = next_id.masked_fill(done, model.config.pad_id)  # finished rows get pad
            ys = torch.cat([ys, next_id[:, None]], dim=1)  # (B, t) -> (B, t + 1)
            done |= next_id == eos_id
            if done.all():
                break
        return ys
    finally:
        model.train(was_training)


def _length_penalty(length, alpha: float):
    """((5 + |Y|) / 6) ** alpha, the length normalisation of Wu et al. 2016, Eq. 14 (numbers or tensors)."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(model: Transformer, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int,
                beam_size: int = 4, length_penalty: float = 0.6) -> torch.Tensor:
    """Keep the beam_size most likely prefixes at every step; return the best one per example (lesson 08).

    The algorithm, for a batch at once (the k = beam_size beams of B sources are B * k decoder rows):
    1. One live beam <s> with log-probability 0 per source; the other k - 1 slots start at -inf.
    2. Each step extends every beam by every token, adding log P(token | prefix, src) to its score,
       and keeps the k best of the k * V candidates. A beam that has produced eos_id may only
       continue with pad_id, at no cost: it keeps its slot and its score.
    3. Stop when every beam has finished, or after max_len - 1 steps.
    4. Of each source's k beams, return the one with the best length-normalised score
       log P(Y | src) / ((5 + |Y|) / 6) ** alpha (Wu et al. 2016), |Y| = tokens after <s> up to
       and including eos_id (all of them for a beam cut off at max_len).
    Defaults are the 2017 paper's (section 6.1: k = 4, alpha = 0.6). beam_size=1 is greedy decoding.
    Returns (B, L) ids laid out like ``greedy_decode``'s: BOS first, pad_id after eos_id.
    """
    bos_id, eos_id, max_len = check_decode_args(model, src, bos_id, eos_id, max_len)
    beam_size = positive_int(beam_size, "beam_size")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, numbers.Real) \
            or not 0 <= length_penalty < math.inf:
        raise ValueError(f"length_penalty (alpha) must be a finite number >= 0, got {length_penalty!r}")
    was_training = model.training
    model.eval()
    try:
        return _beam_search(model, src, bos_id, eos_id, max_len, beam_size, float(length_penalty))
    finally:
        model.train(was_training)


def _beam_search(model, src, bos_id, eos_id, max_len, k, alpha) -> torch.Tensor:
    B, device, pad_id = src.shape[0], src.device, model.config.pad_id
    memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
    memory, src_mask = memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)  # (B * k, ...)
    ys = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)  # (B * k, 1)
    scores = torch.full((B, k), -math.inf, dtype=torch.float64, device=device)  # (B, k) summed log-probs
    scores[:, 0] = 0.0  # one live beam per source, or the k beams would be k copies of one
    done = torch.zeros(B * k, dtype=torch.bool, device=device)  # (B * k,) has produced eos_id
    lengths = torch.zeros(B * k, dtype=torch.long, device=device)  # (B * k,) tokens after <s>, eos included
    rows_of = torch.arange(B, device=device)[:, None] * k  # (B, 1): first decoder row of each source
    for _ in range(max_len - 1):
        log_probs = torch.log_softmax(model._decode(ys, memory, src_mask)[:, -1].double(), dim=-1)  # (B * k, V)
        V = log_probs.shape[-1]
        pad_only = torch.full_like(log_probs[0], -math.inf)  # (V,): a finished beam continues with pad, free
        pad_only[pad_id] = 0.0
        log_probs = torch.where(done[:, None], pad_only, log_probs)  # (B * k, V)
        total = (scores[:, :, None] + log_probs.view(B, k, V)).view(B, k * V)  # (B, k, V) -> (B, k * V)
        scores, flat = total.topk(k, dim=-1)  # (B, k): the k best candidates of each source
        rows = (rows_of + flat // V).flatten()  # (B * k,): the beam each candidate extends
        token = (flat % V).flatten()  # (B * k,): with which token
        ys = torch.cat([ys[rows], token[:, None]], dim=1)  # (B * k, t + 1)
        lengths = lengths[rows] + (~done[rows]).long()  # a live beam grows by one token
        done = done[rows] | (token == eos_id)
        if done.all():
            break
    normalised = scores / _length_penalty(lengths.view(B, k).double(), alpha)  # (B, k)
    best = normalised.argmax(dim=-1)  # (B,)
    pick = torch.arange(B, device=device) * k + best  # (B,): the decoder row of each source's best beam
    width = 1 + int(lengths[pick].max())  # <s> + the longest returned hypothesis; the rest is padding
    return ys[pick, :width]  # (B, L)


# --- greedy decoding with a KV cache (lesson 09) -------------------------------------------------------
#
# One decoding step must have the same shapes at every step, so that a GPU can replay it as a
# recorded CUDA graph (one launch for the step's few dozen kernels) and the host never has to
# wait for the device: the cache is preallocated at its full length, the position to write is a
# tensor on the device, and the new query attends to all max_len slots with a mask that keeps
# the slots filled so far (a static DecoderCache). On the CPU the same step runs as plain Python.


def _greedy_step(model, cache: DecoderCache, ys, token, done, memory_mask, eos_id: int):
    """The whole one-token step of greedy decoding as a function of preallocated tensors only.

    Reads the newest token from ``token`` (B, 1), runs it through ``model._decode`` with a static
    cache, writes the next token into ``token`` and into column ``t + 1`` of ``ys`` (B, max_len), t
    the token's slot, and updates ``done`` (B,): all in place, so that a CUDA graph recorded from
    one call replays every later step.
    """
    pad_id = model.config.pad_id
    slot = cache.self_attn[0].position  # 0-d tensor on the device: the slot the next token goes to

    def step():
        logits = model._decode(token, None, memory_mask, cache=cache)[:, -1]  # (B, 1, V) -> (B, V)
        next_id = logits.argmax(dim=-1).masked_fill(done, pad_id)  # (B,): finished rows get pad, as in greedy_decode
        ys.index_copy_(1, slot.view(1), next_id[:, None])  # the slot has advanced: column t + 1
        done.logical_or_(next_id == eos_id)
        token.copy_(next_id[:, None])
    return step


def _graphed(step, device, warmup: int = 2):
    """(first, then): ``first`` runs ``warmup`` steps eagerly, ``then`` replays one step as a CUDA graph.

    Eager warm-up steps on a side stream come first, as the CUDA graph documentation asks
    (libraries allocate their workspaces there, not inside the capture); they are real steps.
    Capturing only records the kernels: the recorded step runs at the first replay.
    """
    graph = torch.cuda.CUDAGraph()

    def first(n: int) -> int:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(min(n, warmup)):
                step()
        torch.cuda.current_stream(device).wait_stream(stream)
        with torch.cuda.graph(graph):
            step()
        return min(n, warmup)

    return first, graph.replay


@torch.no_grad()
def greedy_decode_cached(model, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int,
                         cuda_graph: bool | None = None, check_every: int = 16) -> torch.Tensor:
    """helpers.transformer.greedy_decode with a KV cache: the same ids, one new position per step (lesson 09).

    Each step runs the decoder on the newest token only; keys and values of the earlier positions
    come from the cache, and the cross-attention's keys and values of the memory are projected
    once. The arguments are checked once; the step never waits for the device; whether every row
    has finished is read every ``check_every`` steps, and the steps after that only write pads,
    which are cut off. On CUDA (``cuda_graph`` None or True) the step is recorded once as a CUDA
    graph and replayed; elsewhere the same step runs eagerly. Returns (B, L) ids laid out
    exactly as greedy_decode's.
    """
    bos_id, eos_id, max_len = check_decode_args(model, src, bos_id, eos_id, max_len)
    check_every = positive_int(check_every, "check_every")
    device = src.device
    if cuda_graph is None:
        cuda_graph = device.type == "cuda"
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a CUDA device, got src on {device}")
    pad_id = model.config.pad_id
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        B = src.shape[0]
        cache = model.new_decode_cache(memory, max_len, static=True)
        # A mask that keeps everything changes nothing but costs time at every step: drop it.
        memory_mask = None if bool(src_mask.all()) else src_mask  # (B, 1, 1, S) or None; read once
        ys = torch.full((B, max_len), pad_id, dtype=torch.long, device=device)  # (B, max_len)
        ys[:, 0] = bos_id
        token = ys[:, :1].clone()  # (B, 1): the newest token, an input buffer of the step
        done = torch.zeros(B, dtype=torch.bool, device=device)  # (B,)
        step = _greedy_step(model, cache, ys, token, done, memory_mask, eos_id)
        n_steps, ran = max_len - 1, 0
        if cuda_graph and n_steps > 2:  # two eager warm-up steps, then the graph
            first, step = _graphed(step, device, warmup=2)
            ran = first(n_steps)
        while ran < n_steps:
            step()
            ran += 1
            if ran % check_every == 0 and bool(done.all()):  # the only read from the device in the loop
                break
        # greedy_decode stops after the step at which the last row finished: cut there
        body = ys[:, 1:ran + 1]  # (B, ran)
        finished = (body == eos_id).any(dim=1)  # (B,)
        first_eos = (body == eos_id).int().argmax(dim=1)  # (B,): column of the first eos (0 if none)
        L = 1 + int(torch.where(finished, first_eos + 1, torch.full_like(first_eos, ran)).max())
        return ys[:, :L]
    finally:
        model.train(was_training)
