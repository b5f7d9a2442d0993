"""The encoder-decoder Transformer of Vaswani et al. 2017 (lessons 07 and 08).

Lesson 07 derives ``TransformerConfig`` and ``EncoderLayer``; lesson 08 derives ``DecoderLayer``,
``Encoder``, ``Decoder`` and ``Transformer``. The shared layers (``FeedForward``, ``Residual``) live
in ``helpers.layers``, the decoders (``greedy_decode``, ``beam_search``, ``greedy_decode_cached``)
in ``helpers.decoding``; both stay importable from here, where the lessons first meet them.
Masks follow the course's polarity everywhere: boolean, True = may attend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn

from helpers._validate import (
    as_int,
    check_heads,
    check_ids,
    positive_int,
    probability,
    require_bool,
    require_real,
    require_tensor,
    require_type,
    shape_str,
)
from helpers.attention import MultiHeadAttention
from helpers.decoding import beam_search, greedy_decode, greedy_decode_cached  # noqa: F401 (lessons import them here)
from helpers.layers import ACTIVATIONS, FeedForward, Residual, check_activation  # noqa: F401 (FeedForward: lesson 07)
from helpers.masks import cached_causal_mask, causal_mask, padding_mask_from_ids
from helpers.positional import PositionalEncoding

# --- configuration ---------------------------------------------------------------------------


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
        check_heads(self.d_model, self.n_heads)
        probability(self.dropout, "dropout")
        smallest = min(self.src_vocab_size, self.tgt_vocab_size)
        object.__setattr__(self, "pad_id", as_int(self.pad_id, "pad_id (a token id of both vocabularies)",
                                                  minimum=0, maximum=smallest - 1))
        require_bool(self.norm_first, "norm_first", "True (Pre-LN) or False (Post-LN)")
        check_activation(self.activation)
        require_real(self.layer_norm_eps, "layer_norm_eps", 0, 1, "()", "a small positive number")

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


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each wrapped by a ``Residual``: dropout + residual + LayerNorm (lesson 07).

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
        self.residual = Residual(self.dropout, config.norm_first)  # where norm and dropout sit: Pre- or Post-LN
        self.attn_weights = None

    def _attend(self, x, mask):
        out, weights = self.self_attn(x, x, x, mask=mask)  # (B, T, C), (B, H, T, T)
        self.attn_weights = weights.detach()
        return out

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); mask (T, T) or 4-D, broadcastable to (B, H, T, T), True = may attend."""
        C = self.self_attn.d_model
        require_tensor(x, "x", floating=True, dim=3, last=C, what=f"(B, T, C={C})")
        x = self.residual(x, partial(self._attend, mask=mask), self.norm1)  # (B, T, C)
        return self.residual(x, self.ff, self.norm2)  # (B, T, C)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder's memory, feed-forward (lesson 08).

    Each sub-layer has its residual connection and LayerNorm (``norm1``, ``norm2``, ``norm3``), placed
    by a ``Residual`` as in ``EncoderLayer``. After each forward, ``self_attn_weights`` (B, H, T, T) and
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
        self.residual = Residual(self.dropout, config.norm_first)
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
        x = self.residual(x, partial(self._self, mask=self_mask, cache=self_cache), self.norm1)  # (B, T, C)
        x = self.residual(x, partial(self._cross, memory=memory, mask=memory_mask, cache=memory_cache),
                          self.norm2)  # (B, T, C)
        return self.residual(x, self.ff, self.norm3)  # (B, T, C)


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
    """What a Transformer's decoding step reads besides the new ids: ``decode_step(tgt, cache)`` (lessons 08, 09).

    ``memory`` (B, S, C) and ``src_mask`` (B, 1, 1, S) or None: the encoder's output and which of its
    positions are real. Without key/value caches (``self_attn`` None) a step re-reads the whole target
    prefix. With them (``Transformer.new_decode_cache(memory, max_len)``, lesson 09): ``self_attn[i]``,
    the KVCache of decoder layer i's self-attention, one slot per target position; ``cross_attn[i]``,
    its cross-attention's KVCache, the memory's keys and values projected once; ``keep`` (B, max_len):
    True where a stored target token is real (not pad). A step then takes the new tokens only.
    """

    def __init__(self, memory, src_mask=None, self_attn: list | None = None, cross_attn: list | None = None,
                 keep: torch.Tensor | None = None):
        self.memory, self.src_mask = memory, src_mask
        self.self_attn, self.cross_attn, self.keep = self_attn, cross_attn, keep

    @property
    def length(self) -> int:
        """Target positions stored so far (0 without key/value caches)."""
        return 0 if self.self_attn is None else self.self_attn[0].length

    @property
    def max_len(self) -> int | None:
        """Target positions the cache has room for (None without key/value caches: no limit but the model's)."""
        return None if self.self_attn is None else self.self_attn[0].max_len

    def layer(self, i: int):
        """The (self-attention, cross-attention) caches of decoder layer i, as DecoderLayer.forward takes them."""
        return None if self.self_attn is None else (self.self_attn[i], self.cross_attn[i])

    def self_mask(self, real: torch.Tensor) -> torch.Tensor:
        """Note which new target tokens are real, real (B, T_new); return the mask of their self-attention.

        Query j (at slot start + j) may attend to the earlier slots and its own that hold real tokens:
        (B, 1, T_new, S), S the slots the self-attention reads (``KVCache.span``). Without key/value
        caches the new tokens are the whole prefix: causal and padding, (B, 1, T, T).
        """
        if self.self_attn is None:
            return causal_mask(real.shape[1], device=real.device) & real[:, None, None, :]  # (B, 1, T, T)
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


def _run_decoder(decoder, tgt_ids, memory, tgt_mask, memory_mask, cache) -> torch.Tensor:
    """The decoder stack on checked input: embed after the cached positions, every layer, final norm."""
    offset = 0 if cache is None or cache.self_attn is None else cache.self_attn[0].start()
    x = decoder.embed_tokens(tgt_ids, offset=offset)  # (B, T, C)
    for i, layer in enumerate(decoder.layers):
        x = layer(x, memory, tgt_mask, memory_mask, cache=None if cache is None else cache.layer(i))  # (B, T, C)
    return decoder.norm(x)  # (B, T, C)


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
        return _run_decoder(self, tgt_ids, memory, tgt_mask, memory_mask, cache)


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
    and hides target pads. The output layer ``head`` turns each decoder position into V logits.
    ``decode`` checks its input and runs ``decode_step(tgt, cache)``, the one step every decoder of
    ``helpers.decoding`` calls (a loop checks its input once, before it starts).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.head = nn.Linear(config.d_model, config.tgt_vocab_size)  # the output layer: (B, T, C) -> (B, T, V)
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

    def new_decode_cache(self, memory: torch.Tensor, max_len: int | None = None, static: bool = False,
                         src_mask=None) -> DecoderCache:
        """A DecoderCache of the encoder's ``memory`` and ``src_mask`` for ``decode_step`` (lessons 08, 09).

        With ``max_len``, it also holds empty key/value caches for up to max_len target positions, and
        the memory's keys and values are projected once, here; ``static``: fixed shapes at every step
        (see ``KVCache``). Without, each step re-reads the whole prefix (lesson 08's decoders).
        """
        if max_len is None:
            return DecoderCache(memory, src_mask)
        max_len = as_int(max_len, "max_len (at most the model's max_len)", 1, self.config.max_len)
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
        return DecoderCache(memory, src_mask, self_caches, cross_caches, keep)

    def decode(self, tgt: torch.Tensor, memory, src_mask=None, cache: DecoderCache | None = None) -> torch.Tensor:
        """tgt (B, T), memory (B, S, C), src_mask (B, 1, 1, S) -> logits (B, T, V); causal + target padding.

        With a ``cache`` (``new_decode_cache``, lesson 09), tgt holds the new tokens only and the
        logits are theirs; the cached positions come first, and memory may be None. A src_mask given
        here replaces the one the cache holds.
        """
        check_ids(tgt, "tgt", self.config.tgt_vocab_size, self.config.max_len, self.decoder.embed.weight.device)
        if cache is None or memory is not None:
            _check_memory(memory, tgt, self.config.d_model)
        if cache is None:
            return self.decode_step(tgt, DecoderCache(memory, src_mask))
        require_type(cache, "cache", DecoderCache, "a DecoderCache (from model.new_decode_cache)")
        if cache.keep is not None and cache.keep.shape[0] != tgt.shape[0]:
            raise ValueError(f"the cache was made for a batch of {cache.keep.shape[0]}, tgt is "
                             f"{shape_str(tgt.shape)}")
        if src_mask is not None:
            cache.src_mask = src_mask
        return self.decode_step(tgt, cache)

    def decode_step(self, tgt: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """Logits (B, T, V) of the target tokens tgt (B, T) placed after what ``cache`` holds (lessons 08, 09).

        The model interface of ``helpers.decoding``: no checks (a loop checks its input once, and
        reading token ids back from the device at every step would stall it). A test double that
        writes its own next-token distribution overrides this method (and ``encode``).
        """
        tgt_mask = cache.self_mask(tgt != self.config.pad_id)  # (B, 1, T, T) or (B, 1, T, S_cached)
        hidden = _run_decoder(self.decoder, tgt, cache.memory, tgt_mask, cache.src_mask, cache)  # (B, T, C)
        return self.head(hidden)  # (B, T, V)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt (B, T) token ids -> logits (B, T, V) for the token after each target position."""
        memory, src_mask = self.encode(src)  # (B, S, C), (B, 1, 1, S); encode checks src
        check_ids(tgt, "tgt", self.config.tgt_vocab_size, self.config.max_len, self.decoder.embed.weight.device)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(f"src {shape_str(src.shape)} and tgt {shape_str(tgt.shape)} "
                             "must have the same batch size B")
        return self.decode_step(tgt, DecoderCache(memory, src_mask))  # (B, T, V): the ids are checked above
