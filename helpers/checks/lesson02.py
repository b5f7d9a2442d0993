"""Exercise checks of lesson 02: one query, self-attention, hard lookup (each prints one line)."""

from __future__ import annotations

import math

import torch

from helpers.attention import scaled_dot_product_attention
from helpers.checks._core import Bug, Case, CheckResult, Reject, Slip, check, check_prediction, randn, slip_at

__all__ = ["check_one_query", "check_self_attention", "check_hard_lookup", "check_predict_sharpness"]



# --- exercise 1: one query --------------------------------------------------------------------

def _one_query(q, k, v):
    out, _ = scaled_dot_product_attention(q.unsqueeze(0), k, v)  # (1, D) -> (1, Dv)
    return out.squeeze(0)  # (Dv,)


def check_one_query(fn) -> CheckResult:
    """Check ``one_query(q (D,), k (S, D), v (S, Dv)) -> (Dv,)``, attention for a single query (lesson 02)."""
    g = torch.Generator().manual_seed(2)
    cases = [
        Case("a single key (S=1): the output must be v[0]", (randn(g, 4), randn(g, 1, 4), randn(g, 1, 3))),
        Case("D=4, S=5 keys, Dv=3", (randn(g, 4), randn(g, 5, 4), randn(g, 5, 3))),
        Case("D=16, S=9 keys, Dv=16", (randn(g, 16), randn(g, 9, 16), randn(g, 9, 16))),
    ]
    bugs = [
        Bug("your answer matches softmax(k q) v without the scaling: divide the scores by sqrt(D)",
         lambda q, k, v: torch.softmax(k @ q, dim=-1) @ v),
        Bug("your answer matches the plain mean of the values: the weights must come from the scores",
         lambda q, k, v: v.mean(dim=0)),
        Bug("your answer matches (k q / sqrt(D)) v: the scores need a softmax to become weights",
         lambda q, k, v: (k @ q / math.sqrt(q.shape[-1])) @ v),
        Bug("those are the weights (one per key): return their weighted sum of the values, weights @ v",
         lambda q, k, v: torch.softmax(k @ q / math.sqrt(q.shape[-1]), dim=-1)),
        Bug("your scores are divided by D: the scaling is 1 / sqrt(D)",
         lambda q, k, v: torch.softmax(k @ q / q.shape[-1], dim=-1) @ v),
        Bug("your scores are divided by sqrt(S), the number of keys: the scaling is 1 / sqrt(D), the width "
            "of q", lambda q, k, v: torch.softmax(k @ q / math.sqrt(k.shape[0]), dim=-1) @ v),
        Bug("your scores are multiplied by sqrt(D): divide them by it",
            lambda q, k, v: torch.softmax(k @ q * math.sqrt(q.shape[-1]), dim=-1) @ v),
        Bug("your answer matches the plain sum of the values: weigh each value by its softmax weight",
            lambda q, k, v: v.sum(dim=0)),
        Bug("your answer returns the value of the best key alone (a hard lookup): attention mixes every "
            "value with its softmax weight", lambda q, k, v: v[(k @ q).argmax()]),
        Bug("your scores have the wrong sign: the score is q . k, so the most similar key weighs most",
            lambda q, k, v: torch.softmax(-(k @ q) / math.sqrt(q.shape[-1]), dim=-1) @ v),
    ]
    return check("one_query", fn, _one_query, cases, bugs=bugs)


# --- exercise 3: self-attention with projections ------------------------------------------------

def _self_attention(x, w_q, w_k, w_v):
    return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)  # (T, Dv), (T, T)


def check_self_attention(fn) -> CheckResult:
    """Check ``self_attention(x (T, C), w_q (C, D), w_k (C, D), w_v (C, C)) -> (out, weights)`` (lesson 02)."""
    g = torch.Generator().manual_seed(3)
    cases = [
        Case("T=5 tokens, C=12, D=4", (randn(g, 5, 12), randn(g, 12, 4), randn(g, 12, 4), randn(g, 12, 12))),
        Case("T=9 tokens, C=8, D=8", (randn(g, 9, 8), randn(g, 8, 8), randn(g, 8, 8), randn(g, 8, 8))),
        Case("a batch of 2 sequences, x (2, 6, 12), D=3",
             (randn(g, 2, 6, 12), randn(g, 12, 3), randn(g, 12, 3), randn(g, 12, 12))),
    ]

    def scaled_by(width_of, dim=-1):
        def buggy(x, w_q, w_k, w_v):
            scores = (x @ w_q) @ (x @ w_k).transpose(-2, -1) / math.sqrt(width_of(x, w_q))
            weights = torch.softmax(scores, dim=dim)
            return weights @ (x @ w_v), weights
        return buggy

    def transposed_scores(x, w_q, w_k, w_v):
        scores = (x @ w_k) @ (x @ w_q).transpose(-2, -1) / math.sqrt(w_q.shape[-1])  # K Q^T
        weights = torch.softmax(scores, dim=-1)
        return weights @ (x @ w_v), weights

    bugs = [
        Bug("your answer uses x itself as the values: the values are x @ w_v",
         lambda x, w_q, w_k, w_v: scaled_dot_product_attention(x @ w_q, x @ w_k, x)),
        Bug("your answer divides by sqrt(C), the width of x: the scaling uses D, the width of the queries",
         scaled_by(lambda x, w: x.shape[-1])),
        Bug("your answer has no 1/sqrt(D) scaling", scaled_by(lambda x, w: 1.0)),
        Bug("your softmax runs over the queries (dim -2): each query's row of weights must sum to 1",
         scaled_by(lambda x, w: w.shape[-1], dim=-2)),
        Bug("your scores are transposed (K Q^T): row t must hold query t's scores against every key, Q K^T",
         transposed_scores),
        Bug("the two results are swapped: return (out, weights)",
         lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_k, w_v)[::-1]),
        Bug("the queries and keys are projected with the same matrix: q = x @ w_q, k = x @ w_k",
         lambda x, w_q, w_k, w_v: scaled_dot_product_attention(x @ w_q, x @ w_q, x @ w_v)),
        Bug("your softmax runs over dim 0 (the batch, for a batch of sequences): use dim=-1, the keys, "
            "which is right for any number of leading axes", scaled_by(lambda x, w: w.shape[-1], dim=0)),
        Bug("your scores are divided by D: the scaling is 1 / sqrt(D)", scaled_by(lambda x, w: w.shape[-1] ** 2)),
        Bug("return both results, (output, weights): yours returns the output alone",
            lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_k, w_v)[0]),
    ]
    return check("self_attention", fn, _self_attention, cases, bugs=bugs)


# --- exercise 4: the hard lookup, the limit of attention ----------------------------------------

def _hard_lookup(q, k, v):
    best = (q @ k.transpose(-2, -1)).argmax(dim=-1)  # (T, S) -> (T,)
    return v[best]  # (T, Dv)


def check_hard_lookup(fn) -> CheckResult:
    """Check ``hard_lookup(q (T, D), k (S, D), v (S, Dv)) -> (T, Dv)``: the value of the best key (lesson 02)."""
    g = torch.Generator().manual_seed(4)
    near_tie = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.99, 0.0], [-1.0, 0.5]])  # (S, D): keys 1 and 3 nearly tie
    cases = [
        Case("T=3 queries, S=5 keys, D=4, Dv=2", (randn(g, 3, 4), randn(g, 5, 4), randn(g, 5, 2))),
        Case("one query, S=8 keys", (randn(g, 1, 6), randn(g, 8, 6), randn(g, 8, 3))),
        # keys of very different lengths: the largest dot product is not the nearest key here
        Case("T=6 queries, S=6 keys of different lengths",
             (randn(g, 6, 4), randn(g, 6, 4) * torch.linspace(0.2, 3.0, 6).unsqueeze(1), randn(g, 6, 3))),
        # the best key scores only 0.01 above the next: a sharpened softmax still mixes the two values
        Case("two keys whose scores differ by 0.01", (torch.tensor([[1.0, 0.0]]), near_tie, randn(g, 4, 2))),
    ]
    bugs = [
        Bug("your answer picks the nearest key (smallest distance); attention ranks keys by the dot product",
         lambda q, k, v: v[torch.cdist(q, k).argmin(dim=-1)]),
        Bug("your answer takes the argmax over the queries (dim 0): each query picks among the keys",
         lambda q, k, v: v[(q @ k.T).argmax(dim=0)]),
        Bug("your answer is soft attention: take the single best key, not a weighted mix",
         lambda q, k, v: scaled_dot_product_attention(q, k, v)[0]),
        Bug("those are the indices of the best keys: return their values, v[best]",
         lambda q, k, v: (q @ k.T).argmax(dim=-1)),
        Bug("that is the best key itself: return its value, v[best]", lambda q, k, v: k[(q @ k.T).argmax(dim=-1)]),
        Bug("your answer picks the key with the lowest score (argmin): take the argmax",
         lambda q, k, v: v[(q @ k.T).argmin(dim=-1)]),
        Bug("those are one-hot weights (T, S): return the values they pick, v[best] (or weights @ v)",
            lambda q, k, v: torch.nn.functional.one_hot((q @ k.T).argmax(dim=-1), k.shape[0]).to(v.dtype)),
        Bug("your answer ranks keys by cosine similarity, which ignores their lengths: attention ranks them by "
            "the plain dot product q . k",
            lambda q, k, v: v[(torch.nn.functional.normalize(q, dim=-1)
                               @ torch.nn.functional.normalize(k, dim=-1).T).argmax(dim=-1)]),
        Bug("your answer picks the largest |score|: a very negative score is the worst match, not the best; "
            "take the argmax of the scores themselves", lambda q, k, v: v[(q @ k.T).abs().argmax(dim=-1)]),
        Bug("your answer is soft attention without the 1/sqrt(D) scaling: take the single best key, not a "
            "weighted mix", lambda q, k, v: torch.softmax(q @ k.T, dim=-1) @ v),
    ]

    def reference(q, k, v):
        best = _hard_lookup(q, k, v)
        best.values_of_case = v  # for `exact` below; a known bug's output carries no such attribute
        return best

    def exact(got, expected):
        # A softmax with a large factor only approaches the lookup; it must return exactly the best value.
        v = getattr(expected, "values_of_case", None)
        if v is None or not isinstance(got, torch.Tensor) or got.shape != expected.shape or \
                not got.is_floating_point() or torch.equal(got.detach().to(expected.dtype), expected):
            return got
        nearest = torch.cdist(got.detach().to(v.dtype), v).argmin(dim=-1)  # (T,): the value each row is nearest
        if torch.equal(v[nearest], expected):
            return Reject("close to the best key's value but not exactly it: a softmax, however sharp, still "
                          "mixes in the other values (most where two keys nearly tie); take the argmax of the "
                          "scores and index v with it")
        return got

    return check("hard_lookup", fn, reference, cases, bugs=bugs, adapt=exact, atol=0.0, rtol=0.0,
                 bug_tolerance=(1e-5, 1e-4))


# --- predict, then run: how much weight does a margin of 2 buy? ----------------------------------

def _weight_on_best_key() -> float:
    """The weight one query gives its best key when that key scores 2 more than each of 7 others."""
    D = 4
    q = torch.zeros(1, D)
    q[0, 0] = math.sqrt(D)  # (1, D): the scaled score of key s is k[s, 0]
    k = torch.zeros(8, D)
    k[3, 0] = 2.0  # (S, D): key 3 scores 2, the seven others 0
    _, weights = scaled_dot_product_attention(q, k, torch.randn(8, 2, generator=torch.Generator().manual_seed(0)))
    return weights[0, 3].item()


def check_predict_sharpness(predicted) -> CheckResult:
    """Predict then measure: the weight on the best of 8 keys whose scaled score leads the 7 others by 2 (lesson 02)."""
    # The nearest plausible wrong model, eight other keys instead of seven, predicts e^2 / (e^2 + 8) = 0.480,
    # 0.033 below the right 0.5135: a margin of 0.015 accepts rounding and rejects it.
    e2 = math.exp(2)
    slips = [slip_at(e2 / (e2 + 8), "e^2 / (e^2 + 8) counts eight other keys: there are seven, each "
                     "contributing e^0 = 1, so the denominator is e^2 + 7", rel=0.01),
             slip_at(1 / 8, "1/8 is the weight of a uniform row: a score 2 above the rest pulls more"),
             slip_at(math.e / (math.e + 7), "the scores are already divided by sqrt(D): do not divide by "
                     "sqrt(D) = 2 again; the weight is e^2 / (e^2 + 7)"),
             slip_at(2 / 9, "a weight is exp(score) / sum of exp(scores), not score / sum: with exp, key 3 "
                     "gets e^2 / (e^2 + 7)"),
             slip_at(e2 / (e2 + 1), "e^2 / (e^2 + 1) counts one other key: the seven others each add e^0 = 1"),
             slip_at(0.25, "0.25 = 2 / 8 divides the score by the number of keys; the softmax exponentiates: "
                     "e^2 / (e^2 + 7)"),
             Slip("a weight is at most 1: the softmax divides e^2 by the sum over all eight keys",
                  lambda p, m: p > 1),
             Slip("1 would be a hard lookup: the seven other keys still get e^0 = 1 each, so key 3 gets "
                  "e^2 / (e^2 + 7)", lambda p, m: p == 1)]
    return check_prediction("predict_sharpness", predicted, _weight_on_best_key,
                            "weight on the best key", abs_tol=0.015, slips=slips)
