"""Lesson 11's checks: right answers pass with the stored line, stubs say so, plausible wrong answers are named.

Every line is checked to be the only one printed (the `verdict` fixture of conftest.py).
"""

import torch.nn.functional as F

from helpers.checks import (
    check_mean_pool,
    check_previous_token_score,
    check_rank_by_cosine,
    check_wordpiece,
)


def mean_pool(hidden, mask):
    w = mask[..., None].to(hidden.dtype)  # (B, L, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1)


def test_mean_pool(accepts, rejects):
    accepts(check_mean_pool, mean_pool, "✓ mean_pool: matches the reference on all 3 cases")
    rejects(check_mean_pool, lambda h, m: None, "not implemented yet")
    rejects(check_mean_pool, lambda h, m: h.mean(dim=1), "the padded positions are averaged in")
    rejects(check_mean_pool, lambda h, m: (h * m[..., None]).sum(dim=1) / h.shape[1], "divided by L")

    def zeroes_pads_in_place(h, m):
        h[~m] = 0.0
        return h.sum(dim=1) / m.sum(dim=1, keepdim=True)
    rejects(check_mean_pool, zeroes_pads_in_place, "modified its input (argument 1) in place")
    rejects(check_mean_pool, lambda h, m: mean_pool(h, m).numpy(), "got ndarray")
    rejects(check_mean_pool, lambda h, m: mean_pool(h, m).float(), "return dtype torch.float64, got torch.float32")
    rejects(check_mean_pool, lambda h, m: mean_pool(h, m)[:, None], "shape (1, 1, 3)")
    rejects(check_mean_pool, lambda h, m: (h * m[..., None]).sum(dim=1) / (m.sum(dim=1, keepdim=True) + 1),
            "values differ from the reference")  # off by one in the count
    rejects(check_mean_pool, lambda h, m: F.normalize(mean_pool(h, m), dim=-1),
            "the mean is normalised to unit length: return the plain mean; sentence_embeddings normalises afterwards")


def wordpiece(word, vocab):
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                pieces.append(piece)
                start = end
                break
        else:
            return ["[UNK]"]
    return pieces


def test_wordpiece(accepts, rejects):
    accepts(check_wordpiece, wordpiece, "✓ wordpiece: matches the reference on all 8 cases")
    accepts(check_wordpiece, lambda word, vocab: tuple(wordpiece(word, vocab)))  # a tuple of pieces is fine
    rejects(check_wordpiece, lambda word, vocab: None, "not implemented yet")

    def shortest_first(word, vocab):
        pieces, start = [], 0
        while start < len(word):
            for end in range(start + 1, len(word) + 1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    break
            else:
                return ["[UNK]"]
            pieces.append(piece)
            start = end
        return pieces
    rejects(check_wordpiece, shortest_first, "the shortest known piece wins")

    def no_prefix(word, vocab):
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                if word[start:end] in vocab:
                    pieces.append(word[start:end])
                    start = end
                    break
            else:
                return ["[UNK]"]
        return pieces
    rejects(check_wordpiece, no_prefix, 'looked up without "##"')

    def keeps_known_pieces(word, vocab):
        pieces = []
        for piece in wordpiece_parts(word, vocab):
            pieces.append(piece)
            if piece == "[UNK]":
                break
        return pieces
    rejects(check_wordpiece, keeps_known_pieces, '["[UNK]"] alone')
    rejects(check_wordpiece, lambda word, vocab: " ".join(wordpiece(word, vocab)), "return a list of strings")
    rejects(check_wordpiece, lambda word, vocab: wordpiece(word, vocab)[:-1] or ["[UNK]"],  # off by one
            "✗ wordpiece: on \"playing\"")

    def empties_vocab(word, vocab):  # in place on a set: the next word would find nothing
        pieces = wordpiece(word, vocab)
        vocab.discard(pieces[0])
        return pieces
    line = rejects(check_wordpiece, empties_vocab, "✗ wordpiece")
    assert "matches" not in line


def wordpiece_parts(word, vocab):
    """The pieces found up to the first unknown one, then "[UNK]" (the bug of keeping them)."""
    start = 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                yield piece
                start = end
                break
        else:
            yield "[UNK]"
            return


def previous_token_score(weights):
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1)  # weights[h, i, i - 1]


def test_previous_token_score(accepts, rejects):
    accepts(check_previous_token_score, previous_token_score,
            "✓ previous_token_score: matches the reference on all 3 cases")
    rejects(check_previous_token_score, lambda w: None, "not implemented yet")
    rejects(check_previous_token_score, lambda w: w.diagonal(dim1=-2, dim2=-1).mean(-1), "each token on itself")
    rejects(check_previous_token_score, lambda w: w.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1), "the next token")
    rejects(check_previous_token_score, lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / w.shape[-1],
            "divided by T")
    rejects(check_previous_token_score, lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1)[:, 1:].mean(-1),
            "✗ previous_token_score: on 3 heads of random weights")  # off by one: skips query 1

    def normalises_in_place(w):
        w /= w.sum(dim=-1, keepdim=True)
        return previous_token_score(w)
    rejects(check_previous_token_score, normalises_in_place, "modified its input (argument 1) in place")
    rejects(check_previous_token_score, lambda w: previous_token_score(w).tolist(), "got list")
    rejects(check_previous_token_score, lambda w: previous_token_score(w).float(), "return dtype torch.float64")


def rank_by_cosine(query, corpus):
    return F.cosine_similarity(corpus, query[None, :], dim=-1).argsort(descending=True)


def test_rank_by_cosine(accepts, rejects):
    accepts(check_rank_by_cosine, rank_by_cosine, "✓ rank_by_cosine: matches the reference on all 3 cases")
    accepts(check_rank_by_cosine, lambda q, c: rank_by_cosine(q, c).tolist())  # a list of indices is fine
    rejects(check_rank_by_cosine, lambda q, c: None, "not implemented yet")
    rejects(check_rank_by_cosine, lambda q, c: (c @ q).argsort(descending=True), "ranks by the dot product")
    rejects(check_rank_by_cosine, lambda q, c: rank_by_cosine(q, c).flip(0), "the least similar first")
    rejects(check_rank_by_cosine, lambda q, c: rank_by_cosine(q, c).numpy(), "got ndarray")
    rejects(check_rank_by_cosine, lambda q, c: rank_by_cosine(q, c)[:-1], "shape (3,)")  # off by one: drops the last
    rejects(check_rank_by_cosine, lambda q, c: rank_by_cosine(q, c) + 1, "✗ rank_by_cosine")  # 1-based indices
    rejects(check_rank_by_cosine, lambda q, c: F.cosine_similarity(c, q[None, :], dim=-1).sort(descending=True).values,
            "return the indices (argsort), not the similarities")
    accepts(check_rank_by_cosine, lambda q, c: rank_by_cosine(q, c).double())  # whole numbers in floats are indices

    def normalises_in_place(q, c):
        c /= c.norm(dim=-1, keepdim=True)
        return (c @ q).argsort(descending=True)
    rejects(check_rank_by_cosine, normalises_in_place, "modified its input (argument 2) in place")
