"""Exercise checks of lesson 11: a pretrained Transformer (each prints one line, returns True/False)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.checks._core import Case, CheckResult, run_check

__all__ = ["check_mean_pool", "check_wordpiece", "check_previous_token_score", "check_rank_by_cosine"]


def _mean_pool(hidden, mask):
    w = mask[..., None].to(hidden.dtype)  # (B, L, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1)  # (B, L, C) -> (B, C)


def check_mean_pool(fn) -> CheckResult:
    """Check ``mean_pool(hidden (B, L, C), mask (B, L) bool) -> (B, C)``, the mean over real tokens (lesson 11)."""
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    big_pads = hidden.clone()
    big_pads[~mask] = 1e6  # pads holding large values: they must not leak into the mean
    cases = [Case("no padding (B=1, L=4, C=3)", (torch.randn(1, 4, 3, generator=g, dtype=torch.float64),
                                                 torch.ones(1, 4, dtype=torch.bool))),
             Case("three sentences of 5, 3 and 1 real tokens", (hidden, mask)),
             Case("the same with 1e6 in every padded position", (big_pads, mask))]
    return run_check("mean_pool", fn, _mean_pool, cases, atol=1e-9, rtol=1e-9)


def _wordpiece(word, vocab):
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
            end -= 1
        if end == start:
            return ["[UNK]"]
        pieces.append(piece)
        start = end
    return pieces


_VOCAB = {"[UNK]", "un", "##believ", "##able", "##ab", "##le", "play", "##ing", "##s", "p", "##l", "##a", "##y",
          "hippo", "##pot", "##amus", "##o", "##p", "a"}


def check_wordpiece(fn) -> CheckResult:
    """Check ``wordpiece(word, vocab) -> list[str]``, greedy longest-match-first WordPiece (lesson 11)."""
    cases = [Case('"playing": a word and one continuation', ("playing", _VOCAB)),
             Case('"unbelievable": "##able" must win over "##ab" + "##le" (longest first)', ("unbelievable", _VOCAB)),
             Case('"hippopotamus"', ("hippopotamus", _VOCAB)),
             Case('"play": a whole word in the vocabulary', ("play", _VOCAB)),
             Case('"plays"', ("plays", _VOCAB)),
             Case('"playz": no piece for "z", so the whole word is ["[UNK]"]', ("playz", _VOCAB)),
             Case('"xylophone": not even the first character is known', ("xylophone", _VOCAB))]

    def adapt(got, expected):
        return list(got) if isinstance(got, (list, tuple)) else got

    return run_check("wordpiece", fn, _wordpiece, cases, adapt=adapt)


def _previous_token_score(weights):
    T = weights.shape[-1]
    i = torch.arange(1, T)
    return weights[:, i, i - 1].mean(dim=-1)  # (H, T - 1) -> (H,)


def check_previous_token_score(fn) -> CheckResult:
    """Check ``previous_token_score(weights (H, T, T)) -> (H,)``, mean of weights[h, i, i-1] for i >= 1 (lesson 11)."""
    g = torch.Generator().manual_seed(11)
    random = torch.softmax(torch.randn(3, 6, 6, generator=g, dtype=torch.float64), dim=-1)
    shift = torch.zeros(2, 5, 5, dtype=torch.float64)
    shift[:, 0, 0] = 1.0
    shift[:, torch.arange(1, 5), torch.arange(0, 4)] = 1.0  # head 0 and 1: all weight on i - 1
    shift[1] = torch.eye(5, dtype=torch.float64)  # head 1: all weight on itself, score 0
    cases = [Case("3 heads of random weights, T=6", (random,)),
             Case("a perfect previous-token head (score 1) and a self head (score 0)", (shift,)),
             Case("one head, T=2", (torch.tensor([[[1.0, 0.0], [0.25, 0.75]]], dtype=torch.float64),))]
    return run_check("previous_token_score", fn, _previous_token_score, cases, atol=1e-9, rtol=1e-9)


def _rank_by_cosine(query, corpus):
    sims = F.normalize(corpus, dim=-1) @ F.normalize(query, dim=-1)  # (N, C) @ (C,) -> (N,)
    return sims.argsort(descending=True)


def check_rank_by_cosine(fn) -> CheckResult:
    """Check ``rank_by_cosine(query (C,), corpus (N, C)) -> (N,)`` indices, most similar first (lesson 11)."""
    corpus = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.2]], dtype=torch.float64)
    scaled = corpus * torch.tensor([[10.0], [0.1], [3.0], [5.0]], dtype=torch.float64)
    g = torch.Generator().manual_seed(11)
    cases = [Case("unit query along x; cosines 1, 0, 0.71, -0.98", (torch.tensor([1.0, 0.0], dtype=torch.float64),
                                                                     corpus)),
             Case("the same corpus with rows of very different lengths: use cosine, not the dot product",
                  (torch.tensor([0.2, 1.0], dtype=torch.float64), scaled)),
             Case("8 random vectors of width 16", (torch.randn(16, generator=g, dtype=torch.float64),
                                                   torch.randn(8, 16, generator=g, dtype=torch.float64)))]

    def adapt(got, expected):
        return torch.as_tensor(got).long() if isinstance(got, (torch.Tensor, list, tuple)) else got

    return run_check("rank_by_cosine", fn, _rank_by_cosine, cases, adapt=adapt)
