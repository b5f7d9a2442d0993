"""Sequence-to-sequence before Transformers: a GRU encoder-decoder, with and without attention (lesson 01).

Two decoders share one interface, so a `Seq2Seq` can wrap either:

- `Decoder` sees the source only through ONE fixed-length context vector (Cho et al. 2014);
- `AttentionDecoder` scores ALL encoder states at every output step with additive attention,
  softmaxes the scores and reads a weighted sum (Bahdanau et al. 2015): of the encoder states
  themselves, as in the paper, or of the source token embeddings (``Seq2Seq(..., read="embeddings")``).

Token ids use `helpers.data.Vocab`'s convention: positions holding ``pad_id`` are padding.

A `Seq2Seq` decodes through ``helpers.decoding``'s model interface: ``decode_step(ids, cache)`` with a
`DecoderState` as the cache; the loop itself is ``helpers.decoding.greedy_decode_rnn``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from helpers._validate import (
    as_int,
    check_ids,
    positive_int,
    positive_ints,
    require_choice,
    require_tensor,
    shape_str,
)
from helpers.attention import AdditiveAttention
from helpers.decoding import greedy_decode_rnn
from helpers.masks import padding_mask_from_ids


def source_mask(src: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """(B, S) boolean mask of real source tokens, True = may attend; padding must be at the end (lesson 01)."""
    mask = padding_mask_from_ids(src, pad_id)[:, 0, 0]  # (B, 1, 1, S) -> (B, S): the RNN's attention has no heads
    lengths = mask.sum(dim=1)  # (B,)
    if (lengths == 0).any():
        bad = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"source rows {bad} hold only padding (pad_id={pad_id}); every row needs a token")
    prefix = torch.arange(src.shape[1], device=src.device) < lengths[:, None]  # (B, S)
    if not torch.equal(mask, prefix):
        bad = (mask != prefix).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"source rows {bad} have pad_id={pad_id} before a real token; pad on the right only")
    return mask


class Encoder(nn.Module):
    """GRU encoder: token ids (B, S) -> states (B, S, E) and a summary (B, E), E = hidden * directions (lesson 01)."""

    def __init__(self, vocab_size: int, emb_dim: int, hidden_dim: int, bidirectional: bool = True,
                 pad_id: int = 0):
        super().__init__()
        vocab_size, emb_dim, hidden_dim = positive_ints(vocab_size=vocab_size, emb_dim=emb_dim, hidden_dim=hidden_dim)
        self.vocab_size = vocab_size
        self.pad_id = as_int(pad_id, "pad_id (a token id)", 0, vocab_size - 1)
        self.out_dim = hidden_dim * (2 if bidirectional else 1)
        self.embed = nn.Embedding(vocab_size, emb_dim, padding_idx=pad_id)
        self.gru = nn.GRU(emb_dim, hidden_dim, batch_first=True, bidirectional=bidirectional)

    def forward(self, src: torch.Tensor):
        """src (B, S) ids -> (states (B, S, E), zero at padding; final (B, E): last state of each direction)."""
        check_ids(src, "src", self.vocab_size, device=self.embed.weight.device)
        B, S = src.shape
        lengths = source_mask(src, self.pad_id).sum(dim=1)  # (B,)
        # Packing makes each row stop at its own length, so padding never enters the recurrence
        # and the backward direction starts at the row's last real token.
        packed = pack_padded_sequence(self.embed(src), lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, h_n = self.gru(packed)  # h_n (directions, B, hidden)
        states, _ = pad_packed_sequence(states, batch_first=True, total_length=S)  # (B, S, E)
        final = h_n.transpose(0, 1).reshape(B, self.out_dim)  # (directions, B, hidden) -> (B, E)
        return states, final


class Decoder(nn.Module):
    """GRU decoder that sees the source only through one fixed context vector c (Cho et al. 2014; lesson 01).

    c is the encoder's summary; it initialises the state and is fed, unchanged, to every step.
    """

    def __init__(self, vocab_size: int, emb_dim: int, hidden_dim: int, context_dim: int):
        super().__init__()
        vocab_size, emb_dim, hidden_dim, context_dim = positive_ints(
            vocab_size=vocab_size, emb_dim=emb_dim, hidden_dim=hidden_dim, context_dim=context_dim)
        self.vocab_size, self.context_dim = vocab_size, context_dim
        self.embed = nn.Embedding(vocab_size, emb_dim)
        self.init_state = nn.Linear(context_dim, hidden_dim)
        self.gru = nn.GRU(emb_dim + context_dim, hidden_dim, batch_first=True)
        self.out = nn.Linear(hidden_dim + context_dim + emb_dim, vocab_size)

    def start(self, states, final, mask, values=None):
        """Decoder memory from the encoder: (state s_0 (B, hidden), context c (B, E)); states are not used."""
        require_tensor(final, "final", floating=True, dim=2, last=self.context_dim, what=f"(B, E={self.context_dim})")
        return torch.tanh(self.init_state(final)), final

    def forward(self, tgt_in: torch.Tensor, memory):
        """Teacher forcing: tgt_in (B, T) ids -> (logits (B, T, V), new memory, None: no attention)."""
        s, c = memory
        B, T = tgt_in.shape
        e = self.embed(tgt_in)  # (B, T, emb)
        c_t = c[:, None, :].expand(B, T, c.shape[-1])  # the same c at every step: (B, E) -> (B, T, E)
        h, s_last = self.gru(torch.cat([e, c_t], dim=-1), s[None])  # (B, T, hidden), (1, B, hidden)
        logits = self.out(torch.cat([h, c_t, e], dim=-1))  # (B, T, V)
        return logits, (s_last[0], c), None


class AttentionDecoder(nn.Module):
    """GRU decoder with Bahdanau et al. 2015 additive attention over ALL encoder states (lesson 01).

    Step i: the previous state s_{i-1} scores every encoder state (the keys), a softmax turns the
    scores into weights a_i (summing to 1 over the real tokens), the context c_i is the weighted sum
    of the values (the encoder states, or the source embeddings), and the GRU reads
    [embedding of y_{i-1}; c_i] to give s_i.
    """

    def __init__(self, vocab_size: int, emb_dim: int, hidden_dim: int, context_dim: int, attn_dim: int,
                 value_dim: int | None = None):
        super().__init__()
        vocab_size, emb_dim, hidden_dim, context_dim, attn_dim = positive_ints(
            vocab_size=vocab_size, emb_dim=emb_dim, hidden_dim=hidden_dim, context_dim=context_dim, attn_dim=attn_dim)
        value_dim = None if value_dim is None else positive_int(value_dim, "value_dim")
        self.vocab_size, self.context_dim = vocab_size, context_dim
        self.value_dim = context_dim if value_dim is None else value_dim
        self.embed = nn.Embedding(vocab_size, emb_dim)
        self.init_state = nn.Linear(context_dim, hidden_dim)
        self.attention = AdditiveAttention(hidden_dim, context_dim, attn_dim)
        self.cell = nn.GRUCell(emb_dim + self.value_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim + self.value_dim + emb_dim, vocab_size)

    def start(self, states, final, mask, values=None):
        """Decoder memory from the encoder: (s_0, W_k h_j, values, mask); values default to the states."""
        require_tensor(final, "final", floating=True, dim=2, last=self.context_dim, what=f"(B, E={self.context_dim})")
        values = states if values is None else values
        if values.shape[:2] != states.shape[:2] or values.shape[-1] != self.value_dim:
            raise ValueError(f"values must be (B, S, {self.value_dim}) for states {shape_str(states.shape)}, "
                             f"got {shape_str(values.shape)}")
        if mask.shape != states.shape[:2] or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a boolean (B, S) = {shape_str(states.shape[:2])} tensor, "
                             f"got {shape_str(mask.shape)} {mask.dtype}")
        # W_k h_j does not depend on the output step, so it is computed once per source
        # (Bahdanau et al. 2015, appendix A.1.2), not once per step as attention(...) would.
        keys = self.attention.w_k(states)  # (B, S, E) -> (B, S, attn)
        return torch.tanh(self.init_state(final)), keys, values, mask

    def attend(self, s, memory):
        """One additive-attention read with query s (B, hidden) -> (context (B, Dv), weights (B, S)).

        Equal to ``self.attention(s[:, None], states, values, mask[:, None])`` with W_k h_j precomputed.
        """
        _, keys, values, mask = memory
        hidden = torch.tanh(self.attention.w_q(s)[:, None, :] + keys)  # (B, 1, attn) + (B, S, attn) -> (B, S, attn)
        scores = self.attention.v(hidden).squeeze(-1).masked_fill(~mask, float("-inf"))  # (B, S)
        weights = torch.softmax(scores, dim=-1)  # (B, S); no row is all -inf: each source has a token
        return (weights[:, None, :] @ values)[:, 0], weights  # (B, 1, S) @ (B, S, Dv) -> (B, Dv); (B, S)

    def forward(self, tgt_in: torch.Tensor, memory):
        """Teacher forcing: tgt_in (B, T) ids -> (logits (B, T, V), new memory, weights (B, T, S))."""
        s = memory[0]
        e = self.embed(tgt_in)  # (B, T, emb)
        states, contexts, weights = [], [], []
        for i in range(tgt_in.shape[1]):  # the query s_{i-1} depends on step i-1: a loop, not a batch
            c, a = self.attend(s, memory)  # (B, Dv), (B, S)
            s = self.cell(torch.cat([e[:, i], c], dim=-1), s)  # (B, hidden)
            states.append(s)
            contexts.append(c)
            weights.append(a)
        h, c = torch.stack(states, dim=1), torch.stack(contexts, dim=1)  # (B, T, hidden), (B, T, Dv)
        logits = self.out(torch.cat([h, c, e], dim=-1))  # (B, T, V)
        return logits, (s, *memory[1:]), torch.stack(weights, dim=1)  # (B, T, V), memory, (B, T, S)


class DecoderState:
    """What an RNN decoder carries from one ``Seq2Seq.decode_step`` to the next: the cache (lesson 01).

    ``memory``: the decoder's memory after the tokens fed so far (``Decoder.start``'s or
    ``AttentionDecoder.start``'s tuple, its first entry the state s_i); ``weights``: one entry per
    step, the step's attention weights (B, T, S), or None for the fixed-context decoder.
    """

    def __init__(self, memory):
        self.memory, self.weights = memory, []


class Seq2Seq(nn.Module):
    """Encoder + decoder: teacher-forced ``forward`` and ``greedy_decode`` with attention weights (lesson 01).

    ``read`` says what an attention decoder sums: "states", the encoder states (Bahdanau et al. 2015),
    or "embeddings", the source token embeddings at the positions it attends to.
    """

    def __init__(self, encoder: Encoder, decoder: nn.Module, read: str = "states", bos_id: int = 1,
                 eos_id: int = 2):
        super().__init__()
        require_choice(read, "read", ("states", "embeddings"))
        if decoder.context_dim != encoder.out_dim:
            raise ValueError(f"the decoder expects encoder states of width {decoder.context_dim}, but the "
                             f"encoder gives {encoder.out_dim}")
        if read == "embeddings":
            if not isinstance(decoder, AttentionDecoder):
                raise ValueError("read='embeddings' needs an AttentionDecoder: a fixed-context Decoder reads "
                                 "nothing but its context vector")
            if decoder.value_dim != encoder.embed.embedding_dim:
                raise ValueError(f"read='embeddings' needs AttentionDecoder(value_dim="
                                 f"{encoder.embed.embedding_dim}), the encoder's embedding width; got "
                                 f"value_dim={decoder.value_dim}")
        elif getattr(decoder, "value_dim", encoder.out_dim) != encoder.out_dim:
            raise ValueError(f"read='states' needs value_dim={encoder.out_dim} (the encoder state width), "
                             f"got value_dim={decoder.value_dim}")
        self.encoder, self.decoder, self.read = encoder, decoder, read
        self.pad_id = encoder.pad_id
        self.bos_id = as_int(bos_id, "bos_id (a target token id)", 0, decoder.vocab_size - 1)  # fed to the decoder
        self.eos_id = as_int(eos_id, "eos_id (a target token id)", 0, decoder.vocab_size - 1)

    def start(self, src: torch.Tensor):
        """Encode src (B, S) and return the decoder's initial memory."""
        states, final = self.encoder(src)  # (B, S, E), (B, E)
        mask = source_mask(src, self.pad_id)  # (B, S)
        values = self.encoder.embed(src) if self.read == "embeddings" else None  # (B, S, emb)
        return self.decoder.start(states, final, mask, values)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor):
        """src (B, S), tgt_in (B, T) = <s> + target[:-1] -> (logits (B, T, V), weights (B, T, S) or None)."""
        check_ids(src, "src", self.encoder.vocab_size, device=self.encoder.embed.weight.device)
        check_ids(tgt_in, "tgt_in", self.decoder.vocab_size, device=self.decoder.embed.weight.device)  # refuses T = 0
        if tgt_in.shape[0] != src.shape[0]:
            raise ValueError(f"src {shape_str(src.shape)} and tgt_in {shape_str(tgt_in.shape)} disagree on B")
        logits, _, weights = self.decoder(tgt_in, self.start(src))
        return logits, weights

    def greedy_decode(self, src: torch.Tensor, max_len: int, return_attention: bool = False):
        """Feed back the most likely token for ``max_len`` steps -> ids (B, max_len) [, weights (B, max_len, S)].

        Positions after a row's first </s> are set to pad_id. Weights are None for the fixed-context decoder.
        The layout differs from lesson 08's ``helpers.transformer.greedy_decode``, which puts <s> in
        column 0 and stops once every row has finished: here every column is a generated token and
        there are always max_len of them (lesson 01's plots read one column per step). The loop is
        ``helpers.decoding.greedy_decode_rnn``, over ``new_decode_cache`` and ``decode_step``: not
        ``greedy_decode``'s, which re-reads the whole prefix each step where an RNN reads each token once.
        """
        return greedy_decode_rnn(self, src, max_len, return_attention)

    def new_decode_cache(self, src: torch.Tensor) -> DecoderState:
        """Encode src (B, S): a DecoderState holding the decoder's initial memory, for ``decode_step``."""
        return DecoderState(self.start(src))

    def decode_step(self, ids: torch.Tensor, cache: DecoderState) -> torch.Tensor:
        """Logits (B, T, V) of the target ids (B, T) fed after the tokens ``cache`` has read, unchecked.

        The model interface of ``helpers.decoding``. An RNN reads each token once: the step advances
        ``cache.memory`` past ids and appends its attention weights (B, T, S) or None to ``cache.weights``.
        """
        logits, cache.memory, weights = self.decoder(ids, cache.memory)  # (B, T, V), memory, weights
        cache.weights.append(weights)
        return logits
