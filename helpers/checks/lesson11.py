"""Exercise checks of lesson 11: a pretrained Transformer (each prints one line, returns True/False)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from helpers.checks._core import Bug, Case, CheckResult, Reject, check, describe

__all__ = ["check_mean_pool", "check_wordpiece", "check_previous_token_score", "check_rank_by_cosine",
           "check_pad_batch"]


def _mean_pool(hidden, mask):
    w = mask[..., None].to(hidden.dtype)  # (B, L, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1)  # (B, L, C) -> (B, C)


def _mean_over_all_positions(hidden, mask):
    return hidden.mean(dim=1)  # the bug: the pads are averaged in


def _divided_by_length(hidden, mask):
    return (hidden * mask[..., None].to(hidden.dtype)).sum(dim=1) / hidden.shape[1]  # the bug: / L, not / count


def _normalised_mean(hidden, mask):
    return F.normalize(_mean_pool(hidden, mask), dim=-1)  # the bug: the unit-length step of sentence_embeddings


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
    bugs = [Bug("the padded positions are averaged in: weight each position by the mask", _mean_over_all_positions),
            Bug("you averaged over the features: the mean runs over the L positions (dim 1), one vector per "
                "sentence", lambda h, m: (h * m[..., None]).sum(-1) / m.sum(-1, keepdim=True)),
            Bug("the sum over real tokens is divided by L: divide by the number of real tokens of each sentence",
                _divided_by_length),
            Bug("the mean is normalised to unit length: return the plain mean; sentence_embeddings normalises "
                "afterwards", _normalised_mean),
            Bug("that is the [CLS] vector (position 0), BERT's pooling for classification; mean pooling averages "
                "the hidden states of every real token, [CLS] and [SEP] included", lambda h, m: h[:, 0]),
            Bug("that is the sum over the real tokens: divide it by the number of real tokens of each sentence",
                lambda h, m: (h * m[..., None].to(h.dtype)).sum(dim=1)),
            Bug("that is max pooling (the largest value of each feature): mean pooling averages the real tokens",
                lambda h, m: h.masked_fill(~m[..., None], float("-inf")).amax(dim=1)),
            Bug("that mixes the sentences: average each sentence's own real tokens, one vector per sentence",
                lambda h, m: h[m].mean(0, keepdim=True).expand(h.shape[0], -1)),
            Bug("the sum is divided by the number of real tokens of the whole batch: divide each sentence's sum "
                "by its own count", lambda h, m: (h * m[..., None].to(h.dtype)).sum(dim=1) / m.sum()),
            Bug("that is the vector at the last position, which is a pad in a padded sentence: average the real "
                "tokens", lambda h, m: h[:, -1]),
            Bug("the last real token of each sentence is left out: average positions 0 .. n-1, where n is its "
                "number of real tokens", lambda h, m: torch.stack([h[b, :max(int(m[b].sum()) - 1, 1)].mean(0)
                                                                    for b in range(h.shape[0])]))]
    return check("mean_pool", fn, _mean_pool, cases, bugs=bugs, atol=1e-9, rtol=1e-9)


def _wordpiece(word, vocab, longest_first=True, prefix="##", keep_found=False):
    """Greedy WordPiece; the keyword arguments reproduce three typical bugs when changed."""
    pieces, start = [], 0
    while start < len(word):
        ends = range(len(word), start, -1) if longest_first else range(start + 1, len(word) + 1)
        known = [end for end in ends if (word[start:end] if start == 0 else prefix + word[start:end]) in vocab]
        if not known:
            return pieces + ["[UNK]"] if keep_found else ["[UNK]"]
        pieces.append(word[start:known[0]] if start == 0 else prefix + word[start:known[0]])
        start = known[0]
    return pieces


_VOCAB = {"[UNK]", "un", "##believ", "##able", "##ab", "##le", "play", "##ing", "##s", "p", "##l", "##a", "##y",
          "hippo", "##pot", "##amus", "##o", "##p", "a", "tool", "to", "##olbox"}


def _wordpiece_backtracking(word, vocab, start=0):
    """Longest first, but backing off to a shorter piece at a dead end: NOT BERT's greedy WordPiece."""
    if start == len(word):
        return []
    for end in range(len(word), start, -1):
        piece = word[start:end] if start == 0 else "##" + word[start:end]
        if piece in vocab:
            rest = _wordpiece_backtracking(word, vocab, end)
            if rest is not None and rest != ["[UNK]"]:
                return [piece] + rest
    return ["[UNK]"] if start == 0 else None


def _spelled(pieces):
    """One string for a list of pieces, so that a wrong answer reads "got 'un ##believ ##ab ##le', expected ..."."""
    if isinstance(pieces, (list, tuple)) and all(isinstance(p, str) for p in pieces):
        return " ".join(pieces)
    return Reject(f"return a list of strings (the pieces), got {describe(pieces)}")


def check_wordpiece(fn) -> CheckResult:
    """Check ``wordpiece(word, vocab) -> list[str]``, greedy longest-match-first WordPiece (lesson 11)."""
    cases = [Case('"playing": a word and one continuation', ("playing", _VOCAB)),
             Case('"unbelievable": "##able" must win over "##ab" + "##le" (longest first)', ("unbelievable", _VOCAB)),
             Case('"hippopotamus"', ("hippopotamus", _VOCAB)),
             Case('"play": a whole word in the vocabulary', ("play", _VOCAB)),
             Case('"plays"', ("plays", _VOCAB)),
             Case('"playz": no piece for "z", so the whole word is ["[UNK]"]', ("playz", _VOCAB)),
             Case('"xylophone": not even the first character is known', ("xylophone", _VOCAB)),
             Case('"toolbox": greedy takes "tool", then nothing fits "box", so ["[UNK]"] (even though '
                  '"to" + "##olbox" exists: WordPiece never backtracks)', ("toolbox", _VOCAB))]

    def spelled(wordpiece):
        return lambda word, vocab: _spelled(wordpiece(word, vocab))

    bugs = [Bug("the shortest known piece wins: try the longest piece first, then shorter ones",
                spelled(functools.partial(_wordpiece, longest_first=False))),
            Bug('pieces after the first are looked up without "##": a continuation is "##" + its characters',
                spelled(functools.partial(_wordpiece, prefix=""))),
            Bug('a word with an unknown part becomes ["[UNK]"] alone, not the pieces found so far plus "[UNK]"',
                spelled(functools.partial(_wordpiece, keep_found=True))),
            Bug('your split backtracks to a shorter piece at a dead end; BERT\'s WordPiece is greedy: it keeps '
                'the longest piece, and if nothing fits the rest, the word is ["[UNK]"]',
                spelled(_wordpiece_backtracking))]
    return check("wordpiece", fn, spelled(_wordpiece), cases, bugs=bugs, adapt=lambda got, expected: _spelled(got))


def _previous_token_score(weights):
    T = weights.shape[-1]
    i = torch.arange(1, T)
    return weights[:, i, i - 1].mean(dim=-1)  # (H, T - 1) -> (H,)


def _self_score(weights):
    return weights.diagonal(dim1=-2, dim2=-1).mean(dim=-1)  # the bug: weights[h, i, i]


def _next_token_score(weights):
    return weights.diagonal(offset=1, dim1=-2, dim2=-1).mean(dim=-1)  # the bug: weights[h, i, i + 1]


def _divided_by_T(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1) / weights.shape[-1]  # the bug: / T


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
    bugs = [Bug("that is the weight of each token on itself: the previous token of query i is key i - 1",
                _self_score),
            Bug("that is the weight on the next token (key i + 1): rows are queries, columns keys", _next_token_score),
            Bug("the sum is divided by T: query 0 has no previous token, so there are T - 1 terms", _divided_by_T),
            Bug("that is the sum over the queries: divide it by their number, T - 1, for the mean",
                lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1)),
            Bug("that is the largest weight on the previous token: return the mean over the queries i = 1 .. T-1",
                lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).amax(dim=-1)),
            Bug("the mean starts at i = 2 (as section 5 does, to skip [CLS]); the exercise asks for every query "
                "i = 1 .. T-1", lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1)[:, 1:].mean(dim=-1)),
            Bug("the mean runs over the heads: return one score per head, averaged over the queries",
                lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=0))]
    return check("previous_token_score", fn, _previous_token_score, cases, bugs=bugs, atol=1e-9, rtol=1e-9)


def _rank_by_cosine(query, corpus):
    sims = F.normalize(corpus, dim=-1) @ F.normalize(query, dim=-1)  # (N, C) @ (C,) -> (N,)
    return sims.argsort(descending=True)


def _rank_by_dot_product(query, corpus):
    return (corpus @ query).argsort(descending=True)  # the bug: long rows win


def _least_similar_first(query, corpus):
    return _rank_by_cosine(query, corpus).flip(0)


def _ranks_not_order(query, corpus):
    return _rank_by_cosine(query, corpus).argsort()  # the rank of each row, not the rows in order


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
    bugs = [Bug("that ranks by the dot product, which favours long rows: divide by both lengths (cosine)",
                _rank_by_dot_product),
            Bug("that puts the least similar first: sort in descending order", _least_similar_first),
            Bug("those are the sorted similarities' positions in the wrong direction: argsort gives the "
                "indices of the corpus rows; you returned the rank of each row", _ranks_not_order),
            Bug("that ranks by the dot product, least similar first: divide by both lengths (cosine) and sort in "
                "descending order", lambda q, c: (c @ q).argsort()),
            Bug("that ranks by Euclidean distance, which depends on the lengths: rank by cosine, the dot product of "
                "the unit-length vectors", lambda q, c: (c - q).norm(dim=-1).argsort())]

    def adapt(got, expected):
        if type(got).__module__ == "torch.return_types":  # what sort() and topk() return
            return Reject("that is the pair (values, indices) of sort(): return its .indices")
        if isinstance(got, (list, tuple)) and all(isinstance(i, (int, torch.Tensor)) for i in got):
            try:
                got = torch.as_tensor([int(i) for i in got])
            except (TypeError, ValueError, RuntimeError):
                return Reject(f"return the (N,) indices as a tensor, got {describe(got)}")
        if not isinstance(got, torch.Tensor) or got.device.type == "meta" or got.is_complex():
            return got
        if got.is_floating_point() and not torch.equal(got, got.round()):  # e.g. the sorted similarities
            return Reject("return the indices (argsort), not the similarities")
        return got.long()

    return check("rank_by_cosine", fn, _rank_by_cosine, cases, bugs=bugs, adapt=adapt)


def _pad_batch(id_lists, pad_id, left=False, flip_mask=False, mask_from_ids=False):
    """Right-pad lists of token ids to (B, L) with pad_id, mask True at real tokens; keywords reproduce slips."""
    L = max(len(ids) for ids in id_lists)
    ids = torch.full((len(id_lists), L), pad_id, dtype=torch.long)  # (B, L)
    mask = torch.zeros(len(id_lists), L, dtype=torch.bool)  # (B, L)
    for b, row in enumerate(id_lists):
        where = slice(L - len(row), L) if left else slice(0, len(row))
        ids[b, where] = torch.tensor(row, dtype=torch.long)
        mask[b, where] = True
    if mask_from_ids:
        mask = ids != pad_id
    return ids, ~mask if flip_mask else mask


def _zero_filled(id_lists, pad_id):
    ids, mask = _pad_batch(id_lists, pad_id)
    return ids.masked_fill(~mask, 0), mask  # the bug: pads of 0 whatever pad_id is


def check_pad_batch(fn) -> CheckResult:
    """Check ``pad_batch(id_lists, pad_id) -> (ids (B, L), mask (B, L))``, as the tokenizer pads (lesson 11)."""
    cases = [Case("one sentence, no padding: [[101, 7592, 102]]", ([[101, 7592, 102]], 0)),
             Case("three sentences of 4, 2 and 3 ids, pad_id=0",
                  ([[101, 2023, 2003, 102], [101, 102], [101, 7592, 102]], 0)),
             Case("the longest sentence last, pad_id=0", ([[101, 102], [101, 2307, 2154, 2003, 102]], 0)),
             Case("a real token equal to pad_id: [[5, 0, 6], [5]], pad_id=0 (the mask comes from the lengths)",
                  ([[5, 0, 6], [5]], 0)),
             Case("pad_id=9", ([[1, 2, 3], [4]], 9))]
    bugs = [Bug("the mask's polarity is flipped: True marks a real token, False a pad",
                lambda lists, p: _pad_batch(lists, p, flip_mask=True)),
            Bug("the pads go on the left; pad on the right, after each sentence's ids, as the tokenizer does",
                lambda lists, p: _pad_batch(lists, p, left=True)),
            Bug("the mask is ids != pad_id, which also hides a real token whose id equals pad_id: build it from "
                "each sentence's length", lambda lists, p: _pad_batch(lists, p, mask_from_ids=True)),
            Bug("the pads are 0 whatever pad_id is: fill with pad_id", _zero_filled)]
    return check("pad_batch", fn, _pad_batch, cases, bugs=bugs)
