"""A decoder-only language model (GPT), readable top to bottom like nanoGPT's ``model.py`` (lesson 12).

Token embedding + learned positions, N Pre-LN blocks of causal ``MultiHeadAttention`` and a GELU
``FeedForward`` (``helpers.layers``), a final LayerNorm, and an output layer that shares the
embedding's weights (Radford et al. 2018/2019; Press & Wolf 2017 for the tying). Sampling lives in
``helpers.decoding`` (``generate``, ``filter_logits``), over ``GPT.decode_step``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from helpers._validate import as_int, check_heads, check_ids, positive_int, probability, require_bool, require_type
from helpers.attention import MultiHeadAttention
from helpers.decoding import filter_logits, generate  # noqa: F401 (filter_logits: lesson 12 imports it here)
from helpers.layers import FeedForward
from helpers.lm import bits_per_char, ngram_bits_per_char, parameter_count, random_windows  # noqa: F401 (lesson 12 imports them here)
from helpers.masks import cached_causal_mask
from helpers.positional import LearnedPositionalEmbedding

CHECKPOINT = "gpt_shakespeare.pt"  # the course's trained model, in data/ (made by `make train-gpt`)


@dataclass(frozen=True)
class GPTConfig:
    """Every size of a GPT in one frozen place; validated on creation (lesson 12)."""

    vocab_size: int  # V, the number of token ids; a property of the tokenizer, so no default
    d_model: int  # width C of the residual stream
    n_heads: int  # query heads H; d_model / n_heads features per head
    n_layers: int  # Pre-LN blocks stacked
    d_ff: int  # hidden width of each feed-forward net; 4 * d_model as in GPT-2
    max_len: int  # longest context: the learned position table has this many rows
    dropout: float = 0.0  # on the embeddings and on each residual branch (GPT-2's embd and resid dropout)
    n_kv_heads: int | None = None  # key/value heads: None = one per query head (MHA), 1 = multi-query
    tie_weights: bool = True  # output layer = embedding matrix (Press & Wolf 2017): fewer parameters
    # ids generate() never samples: the vocabulary's <pad>, <s>, </s>; not a size, so left out of the printout
    special_ids: tuple = field(default=(), repr=False)

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len"):
            object.__setattr__(self, name, positive_int(getattr(self, name), name))  # numpy ints become ints
        if self.n_kv_heads is not None:
            kv = positive_int(self.n_kv_heads, "n_kv_heads")  # numpy ints become ints
            object.__setattr__(self, "n_kv_heads", kv)
        check_heads(self.d_model, self.n_heads, self.n_kv_heads)
        probability(self.dropout, "dropout")
        require_bool(self.tie_weights, "tie_weights")
        require_type(self.special_ids, "special_ids", (tuple, list), "a tuple of token ids")
        special = tuple(sorted({as_int(i, "each of special_ids (a token id)", minimum=0,
                                       maximum=self.vocab_size - 1) for i in self.special_ids}))
        if len(special) == self.vocab_size:
            raise ValueError(f"special_ids {special} cover the whole vocabulary: nothing would be left to sample")
        object.__setattr__(self, "special_ids", special)

    @property
    def head_dim(self) -> int:
        """Features per head, d_model / n_heads (lesson 12)."""
        return self.d_model // self.n_heads

    @classmethod
    def tiny(cls, vocab_size: int = 11, **overrides) -> GPTConfig:
        """A model small enough for unit tests to run in milliseconds (lesson 12)."""
        return replace(cls(vocab_size, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=32), **overrides)

    @classmethod
    def course(cls, vocab_size: int, **overrides) -> GPTConfig:
        """The size of the course's trained checkpoint: C 128, 4 heads, 4 layers, context 128 (lesson 12)."""
        return replace(cls(vocab_size, d_model=128, n_heads=4, n_layers=4, d_ff=512, max_len=128), **overrides)


class Block(nn.Module):
    """One Pre-LN decoder block: x + attn(norm1(x)), then x + ff(norm2(x)) (lesson 12)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        # Dropout sits on each branch's output only, as in nanoGPT's MLP. Not on the attention weights
        # (GPT-2's attn_pdrop): with it, PyTorch's fused CPU attention falls back to slower code and a
        # training step of the course model takes about 1.3x as long on CPU; nor inside the feed-forward.
        self.attn = MultiHeadAttention(config.d_model, config.n_heads, n_kv_heads=config.n_kv_heads)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.ff = FeedForward(config.d_model, config.d_ff, activation="gelu")
        self.dropout = nn.Dropout(config.dropout)  # on each branch, before it joins the residual stream
        self.attn_weights = None  # (B, H, T, S) of the last forward that asked for them

    def forward(self, x, mask=None, need_weights: bool = False, cache=None):
        """x (B, T, C), mask (1, 1, T, S) True = may attend, optional KV cache -> (B, T, C)."""
        x = x + self.dropout(self.self_attend(self.norm1(x), mask, need_weights, cache))  # (B, T, C)
        return x + self.dropout(self.ff(self.norm2(x)))  # (B, T, C)

    def self_attend(self, h, mask=None, need_weights: bool = False, cache=None):
        """Causal self-attention of h (B, T, C) -> (B, T, C); keeps the weights if asked (lessons 12, 13)."""
        out, weights = self.attn(h, h, h, mask=mask, need_weights=need_weights, cache=cache)  # (B, T, C)
        self.attn_weights = None if weights is None else weights.detach()
        return out


class GPT(nn.Module):
    """Decoder-only Transformer: ``forward(ids (B, T)) -> logits (B, T, V)`` for the next token (lesson 12)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        require_type(config, "config", GPTConfig, "a GPTConfig")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = LearnedPositionalEmbedding(config.max_len, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)  # Pre-LN leaves the last block's output unnormalised
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        # GPT-2's initialisation (Radford et al. 2019, section 2.3): N(0, 0.02) for every weight matrix and
        # table, zero biases. GPT-2 also scales the init of the residual projections by 1/sqrt(2 * n_layers):
        # each block writes into the residual stream twice (attention's w_o, the feed-forward's linear2),
        # 2 * n_layers writes add up, and the smaller std keeps the stream's variance from growing with depth.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for block in self.blocks:
            for writer in (block.attn.w_o, block.ff.linear2):
                nn.init.normal_(writer.weight, std=0.02 / math.sqrt(2 * config.n_layers))
        if config.tie_weights:
            self.head.weight = self.embed.weight  # one (V, C) matrix reads tokens in and scores them out

    def forward(self, ids: torch.Tensor, need_weights: bool = False) -> torch.Tensor:
        """ids (B, T) -> logits (B, T, V); ``need_weights`` keeps each block's (B, H, T, T) in ``attn_weights``."""
        check_ids(ids, "ids", self.config.vocab_size, self.config.max_len, self.embed.weight.device)
        return self.decode_step(ids, None, need_weights)  # (B, T, V)

    def decode_step(self, ids: torch.Tensor, caches=None, need_weights: bool = False) -> torch.Tensor:
        """Logits (B, T, V) of ids (B, T) placed after the positions in ``caches`` (None: none), unchecked.

        The model interface of ``helpers.decoding`` (lesson 12): ``forward`` checks, then calls this.
        """
        past, T = (0 if caches is None else caches[0].length), ids.shape[1]
        x = self.dropout(self.pos(self.embed(ids), offset=past))  # (B, T, C), positions past .. past + T - 1
        # query i sits at position past + i and may read positions 0 .. past + i: (1, 1, T, past + T);
        # one new query may read every position, so it needs no mask
        mask = None if T == 1 else cached_causal_mask(past, T, past + T, device=ids.device)[None, None]
        for i, block in enumerate(self.blocks):
            x = block(x, mask, need_weights, None if caches is None else caches[i])  # (B, T, C)
        return self.head(self.norm(x))  # (B, T, V)

    def new_caches(self, batch: int, max_len: int):
        """One empty KV cache per block, from ``MultiHeadAttention.new_cache`` (lesson 12)."""
        return [block.attn.new_cache(batch, max_len) for block in self.blocks]

    def forward_cached(self, ids: torch.Tensor, caches) -> torch.Tensor:
        """Logits (B, T_new, V) of the new ids (B, T_new), after the positions already in ``caches`` (lesson 12)."""
        if not isinstance(caches, (list, tuple)) or len(caches) != len(self.blocks):
            raise TypeError(f"caches must be the list of {len(self.blocks)} KV caches from model.new_caches(batch, "
                            f"max_len), got {type(caches).__name__}")
        check_ids(ids, "ids", self.config.vocab_size, self.config.max_len, self.embed.weight.device)
        return self.decode_step(ids, caches)  # (B, T_new, V)

    def generate(self, ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k=None,
                 top_p=None, generator=None, use_cache: bool = True) -> torch.Tensor:
        """Sample max_new_tokens after ids (B, T) -> (B, T + max_new_tokens): ``helpers.decoding.generate``
        (lesson 12). top_k=1 is greedy; the special ids are never sampled; it may run past max_len."""
        return generate(self, ids, max_new_tokens, temperature, top_k, top_p, generator, use_cache)


def save_checkpoint(model: GPT, vocab, path) -> str:
    """Save config, weights (float32) and vocabulary symbols to ``path``; return its sha256 (lesson 12)."""
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    torch.save({"config": asdict(model.config), "state_dict": state, "symbols": "".join(vocab.itos[3:])}, path)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_course_gpt(device=None):
    """The course's trained GPT (sha256 checked, eval mode) and its ``helpers.data.Vocab`` (lesson 12)."""
    from helpers.data import DataFileError, Vocab, check_sha256, find_data_dir

    path = find_data_dir() / CHECKPOINT
    check_sha256(path)  # the file is there and is the committed one
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if set(saved) != {"config", "state_dict", "symbols"}:
        raise DataFileError(f"{path} does not hold a course GPT checkpoint (keys {sorted(saved)})")
    vocab = Vocab(saved["symbols"])
    config = GPTConfig(**{**saved["config"], "special_ids": (vocab.pad_id, vocab.bos_id, vocab.eos_id)})
    if config.vocab_size != len(vocab):
        raise DataFileError(f"{path} holds a model of vocab_size={config.vocab_size} but a vocabulary of "
                            f"{len(vocab)} tokens")
    model = GPT(config)
    model.load_state_dict(saved["state_dict"])
    return model.to(device if device is not None else "cpu").eval(), vocab
