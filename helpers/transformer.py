"""The encoder-decoder Transformer of Vaswani et al. 2017 (lessons 07 and 08).

Lesson 07 derives ``TransformerConfig``, ``FeedForward`` and ``EncoderLayer``; lesson 08 derives
``DecoderLayer``, ``Encoder``, ``Decoder``, ``Transformer``, ``greedy_decode`` and ``beam_search``.
Masks follow the course's polarity everywhere: boolean, True = may attend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from helpers._validate import TOKEN_ID_DTYPES, positive_ints, probability, require_tensor, shape_str
from helpers.attention import MultiHeadAttention
from helpers.masks import causal_mask
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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: each head gets "
                f"d_model / n_heads = {self.d_model / self.n_heads:g} features, which must be a whole number"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1), got {self.dropout!r}")
        smallest = min(self.src_vocab_size, self.tgt_vocab_size)
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int) or not 0 <= self.pad_id < smallest:
            raise ValueError(
                f"pad_id must be a token id of both vocabularies, i.e. in [0, {smallest}), got {self.pad_id!r}")
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


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each wrapped in dropout + residual + LayerNorm (lesson 07).

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
        return self.dropout(out)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        """x (B, T, C), mask broadcastable to (B, H, T, T) with True = may attend -> (B, T, C)."""
        if self.norm_first:
            x = x + self._attend(self.norm1(x), mask)  # (B, T, C)
            return x + self.dropout(self.ff(self.norm2(x)))  # (B, T, C)
        x = self.norm1(x + self._attend(x, mask))  # (B, T, C)
        return self.norm2(x + self.dropout(self.ff(x)))  # (B, T, C)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder's memory, feed-forward (lesson 08).

    Each sub-layer has its residual connection and LayerNorm (``norm1``, ``norm2``, ``norm3``), placed
    as in ``EncoderLayer``. After each forward, ``self_attn_weights`` (B, H, T, T) and
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

    def _self(self, x, mask):
        out, weights = self.self_attn(x, x, x, mask=mask)  # (B, T, C), (B, H, T, T)
        self.self_attn_weights = weights.detach()
        return self.dropout(out)

    def _cross(self, x, memory, mask):
        out, weights = self.cross_attn(x, memory, memory, mask=mask)  # (B, T, C), (B, H, T, S)
        self.cross_attn_weights = weights.detach()
        return self.dropout(out)

    def forward(self, x, memory, self_mask=None, memory_mask=None) -> torch.Tensor:
        """x (B, T, C), memory (B, S, C); masks broadcastable to (B, H, T, T) and (B, H, T, S) -> (B, T, C)."""
        if self.norm_first:
            x = x + self._self(self.norm1(x), self_mask)  # (B, T, C)
            x = x + self._cross(self.norm2(x), memory, memory_mask)  # (B, T, C)
            return x + self.dropout(self.ff(self.norm3(x)))  # (B, T, C)
        x = self.norm1(x + self._self(x, self_mask))  # (B, T, C)
        x = self.norm2(x + self._cross(x, memory, memory_mask))  # (B, T, C)
        return self.norm3(x + self.dropout(self.ff(x)))  # (B, T, C)


# --- input checks ------------------------------------------------------------------------------


def _check_ids(ids, name: str, vocab_size: int, max_len: int, device: torch.device) -> None:
    """Raise a clear error unless ``ids`` is a (B, L) int64 or int32 tensor of valid ids with L <= max_len
    on ``device``, the device of the model's embedding."""
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


def _key_padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, L) ids -> (B, 1, 1, L) boolean mask, True where the key is a real token (lesson 08)."""
    return (ids != pad_id)[:, None, None, :]  # (B, L) -> (B, 1, 1, L)


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
        """src_ids (B, S), src_mask broadcastable to (B, H, S, S) -> memory (B, S, C)."""
        _check_ids(src_ids, "src", self.config.src_vocab_size, self.config.max_len, self.embed.weight.device)
        x = self.embed_tokens(src_ids)  # (B, S, C)
        for layer in self.layers:
            x = layer(x, src_mask)  # (B, S, C)
        return self.norm(x)  # (B, S, C)


class Decoder(_Stack):
    """Embedding + positional encoding + N decoder layers + final LayerNorm (lesson 08)."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config, config.tgt_vocab_size, DecoderLayer, config.n_decoder_layers)

    def forward(self, tgt_ids, memory, tgt_mask=None, memory_mask=None) -> torch.Tensor:
        """tgt_ids (B, T), memory (B, S, C), masks to (B, H, T, T) and (B, H, T, S) -> hidden (B, T, C)."""
        _check_ids(tgt_ids, "tgt", self.config.tgt_vocab_size, self.config.max_len, self.embed.weight.device)
        C = self.config.d_model
        if not isinstance(memory, torch.Tensor) or memory.dim() != 3 or memory.shape[-1] != C \
                or memory.shape[0] != tgt_ids.shape[0] or not memory.is_floating_point():
            got = f"{shape_str(memory.shape)} {memory.dtype}" if isinstance(memory, torch.Tensor) \
                else type(memory).__name__
            raise ValueError(f"memory must have shape (B={tgt_ids.shape[0]}, S, C={C}) and a floating dtype to "
                             f"match tgt {shape_str(tgt_ids.shape)}, got {got}")
        x = self.embed_tokens(tgt_ids)  # (B, T, C)
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)  # (B, T, C)
        return self.norm(x)  # (B, T, C)


class Transformer(nn.Module):
    """The encoder-decoder Transformer; ``forward(src (B, S), tgt (B, T)) -> logits (B, T, V)`` (lesson 08).

    Padding is handled inside: source positions holding ``pad_id`` are hidden from the encoder's
    self-attention and from the decoder's cross-attention; the decoder's self-attention is causal
    and hides target pads.
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
        _check_ids(src, "src", self.config.src_vocab_size, self.config.max_len, self.encoder.embed.weight.device)
        src_mask = _key_padding_mask(src, self.config.pad_id)  # (B, 1, 1, S)
        return self.encoder(src, src_mask), src_mask  # (B, S, C), (B, 1, 1, S)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask=None) -> torch.Tensor:
        """tgt (B, T), memory (B, S, C), src_mask (B, 1, 1, S) -> logits (B, T, V); causal + target padding."""
        _check_ids(tgt, "tgt", self.config.tgt_vocab_size, self.config.max_len, self.decoder.embed.weight.device)
        T = tgt.shape[1]
        # position t sees the earlier non-pad tokens: (T, T) & (B, 1, 1, T) -> (B, 1, T, T)
        tgt_mask = causal_mask(T, device=tgt.device) & _key_padding_mask(tgt, self.config.pad_id)
        hidden = self.decoder(tgt, memory, tgt_mask, src_mask)  # (B, T, C)
        return self.generator(hidden)  # (B, T, V)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt (B, T) token ids -> logits (B, T, V) for the token after each target position."""
        _check_ids(src, "src", self.config.src_vocab_size, self.config.max_len, self.encoder.embed.weight.device)
        _check_ids(tgt, "tgt", self.config.tgt_vocab_size, self.config.max_len, self.decoder.embed.weight.device)
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(f"src {shape_str(src.shape)} and tgt {shape_str(tgt.shape)} "
                             "must have the same batch size B")
        memory, src_mask = self.encode(src)  # (B, S, C), (B, 1, 1, S)
        return self.decode(tgt, memory, src_mask)  # (B, T, V)


# --- decoding ----------------------------------------------------------------------------------


def check_decode_args(model, src, bos_id, eos_id, max_len) -> None:
    """Raise a clear error unless the arguments of a greedy or beam decoder are valid (lesson 08).

    model must be a Transformer, src (B, S) its source token ids, bos_id and eos_id target token ids
    (bos_id not the pad id), and max_len an int in [2, model max_len]. Shared by every decoder.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a helpers.transformer.Transformer, got {type(model).__name__}")
    cfg = model.config
    _check_ids(src, "src", cfg.src_vocab_size, cfg.max_len, model.encoder.embed.weight.device)
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < cfg.tgt_vocab_size:
            raise ValueError(f"{name} must be a target token id in [0, {cfg.tgt_vocab_size}), got {value!r}")
    if bos_id == cfg.pad_id:
        raise ValueError(f"bos_id={bos_id} equals pad_id={cfg.pad_id}: the decoder would mask its own start token")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or not 2 <= max_len <= cfg.max_len:
        raise ValueError(f"max_len (output length, BOS included) must be an int in [2, model max_len="
                         f"{cfg.max_len}], got {max_len!r}")


def _next_logits(model: Transformer, ys: torch.Tensor, memory: torch.Tensor, src_mask) -> torch.Tensor:
    """Logits (B, V) of the token after ys (B, t): ``model.decode(ys, memory, src_mask)[:, -1]``.

    The same arithmetic as ``Transformer.decode`` without its token-id checks: the decoders check
    their input once, and a check inside the loop would make the host wait for the device at
    every step (``bad.any()``). A subclass that defines its own ``decode`` gets that one.
    """
    if type(model).decode is not Transformer.decode:
        return model.decode(ys, memory, src_mask)[:, -1]
    decoder = model.decoder
    # position t sees the earlier non-pad tokens: (t, t) & (B, 1, 1, t) -> (B, 1, t, t)
    tgt_mask = causal_mask(ys.shape[1], device=ys.device) & _key_padding_mask(ys, model.config.pad_id)
    x = decoder.embed_tokens(ys)  # (B, t, C)
    for layer in decoder.layers:
        x = layer(x, memory, tgt_mask, src_mask)  # (B, t, C)
    return model.generator(decoder.norm(x))[:, -1]  # (B, t, V) -> (B, V)


@torch.no_grad()
def greedy_decode(model: Transformer, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int) -> torch.Tensor:
    """Pick the most likely next token until every row has produced eos_id (lesson 08).

    Returns (B, L) ids with L <= max_len: column 0 is bos_id, and every position after a row's
    eos_id holds pad_id. The model runs in eval mode (no dropout) and its mode is restored after.
    The arguments are checked once, before the loop.
    """
    check_decode_args(model, src, bos_id, eos_id, max_len)
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        B = src.shape[0]
        ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        for _ in range(max_len - 1):
            next_id = _next_logits(model, ys, memory, src_mask).argmax(dim=-1)  # (B, V) -> (B,)
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
    check_decode_args(model, src, bos_id, eos_id, max_len)
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size <= 0:
        raise ValueError(f"beam_size must be a positive int, got {beam_size!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or length_penalty < 0:
        raise ValueError(f"length_penalty (alpha) must be a number >= 0, got {length_penalty!r}")
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
        log_probs = torch.log_softmax(_next_logits(model, ys, memory, src_mask).double(), dim=-1)  # (B * k, V)
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
