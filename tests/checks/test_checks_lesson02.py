"""Lesson 02's checks: right answers pass with the stored line, stubs say so, wrong answers are named."""

import math

import torch

from helpers.attention import scaled_dot_product_attention
from helpers.checks import (
    check_attention,
    check_hard_lookup,
    check_one_query,
    check_predict_sharpness,
    check_self_attention,
)

# --- lesson 02 ------------------------------------------------------------------------------------

def one_query_loop(q, k, v):
    scores = torch.stack([(q * k[j]).sum() for j in range(k.shape[0])]) / math.sqrt(q.shape[0])
    weights = torch.exp(scores) / torch.exp(scores).sum()
    return sum(weights[j] * v[j] for j in range(k.shape[0]))


def test_check_one_query(verdict):
    assert verdict(check_one_query, one_query_loop) == (
        True, "✓ one_query: matches the reference on all 3 cases")
    ok, line = verdict(check_one_query, lambda q, k, v: torch.softmax(k @ q, -1) @ v)
    assert not ok and "D=4, S=5" in line and "divide the scores by sqrt(D)" in line
    ok, line = verdict(check_one_query, lambda q, k, v: v.mean(0))
    assert not ok and "plain mean of the values" in line
    ok, line = verdict(check_one_query, lambda q, k, v: torch.softmax(k @ q / 2.0, -1))
    assert not ok and "shape" in line  # returned the weights (S,) instead of the output (Dv,)


def self_attention(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v, weights


def test_check_self_attention(verdict):
    assert verdict(check_self_attention, self_attention)[0]
    ok, line = verdict(check_self_attention, lambda x, w_q, w_k, w_v: self_attention(x, w_q, w_k, w_v)[0])
    assert not ok and "yours returns the output alone" in line
    bugs = {
        "the values are x @ w_v": lambda x, w_q, w_k, w_v: self_attention(x, w_q, w_k, torch.eye(x.shape[-1])),
        "divides by sqrt(C)": lambda x, w_q, w_k, w_v: self_attention(
            x, w_q * math.sqrt(w_q.shape[-1] / x.shape[-1]), w_k, w_v),
        "no 1/sqrt(D) scaling": lambda x, w_q, w_k, w_v: self_attention(x, w_q * math.sqrt(w_q.shape[-1]), w_k, w_v),
    }
    for hint, buggy in bugs.items():
        ok, line = verdict(check_self_attention, buggy)
        assert not ok and hint in line, line

    def over_queries(x, w_q, w_k, w_v):
        scores = (x @ w_q) @ (x @ w_k).transpose(-2, -1) / math.sqrt(w_q.shape[-1])
        weights = torch.softmax(scores, dim=-2)
        return weights @ (x @ w_v), weights
    ok, line = verdict(check_self_attention, over_queries)
    assert not ok and "softmax runs over the queries" in line


def test_check_hard_lookup(verdict):
    def hard(q, k, v):
        return v[(q @ k.T).argmax(dim=1)]
    assert verdict(check_hard_lookup, hard)[0]
    ok, line = verdict(check_hard_lookup, lambda q, k, v: v[torch.cdist(q, k).argmin(dim=1)])
    assert not ok and "nearest key" in line
    ok, line = verdict(check_hard_lookup, lambda q, k, v: torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1) @ v)
    assert not ok and "soft attention" in line




def test_check_attention(accepts, rejects):
    accepts(check_attention, scaled_dot_product_attention, "✓ attention: matches the reference on all 4 cases")
    accepts(check_attention, lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ v)
    rejects(check_attention, lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v, "no 1/sqrt(D) scaling")
    rejects(check_attention, lambda q, k, v: q @ k, "raised RuntimeError")
    rejects(check_attention, lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -2) @ v, "over the queries")
    rejects(check_attention, lambda q, k, v: torch.softmax(q @ k.view(*k.shape[:-2], k.shape[-1], -1)
                                                           / q.shape[-1] ** 0.5, -1) @ v, "✗ attention")
    rejects(check_attention, lambda q, k, v: scaled_dot_product_attention(q.double(), k.double(), v.double())[0],
            "return dtype torch.float32")

    def scales_in_place(q, k, v):
        q /= q.shape[-1] ** 0.5
        return torch.softmax(q @ k.mT, -1) @ v
    rejects(check_attention, scales_in_place, "in place")


def test_more_wrong_answers(rejects):
    rejects(check_one_query, lambda q, k, v: (torch.softmax(k @ q / math.sqrt(q.shape[0]), -1) @ v).numpy(),
            "return a torch.Tensor")
    rejects(check_one_query, lambda q, k, v: (k @ q / math.sqrt(q.shape[0])) @ v, "need a softmax")
    rejects(check_one_query, lambda q, k, v: torch.softmax(q @ k / math.sqrt(q.shape[0]), -1) @ v, "✗ one_query")
    rejects(check_hard_lookup, lambda q, k, v: v[(q @ k.T).argmax(dim=0)], "✗ hard_lookup")
    rejects(check_hard_lookup, lambda q, k, v: v[(q @ k.T).argmin(dim=1)], "✗ hard_lookup")


def test_predict_sharpness(verdict):
    assert not verdict(check_predict_sharpness, None)[0]
    ok, line = verdict(check_predict_sharpness, math.exp(2) / (math.exp(2) + 7))
    assert ok and line.startswith("✓ predict_sharpness: you predicted 0.5135")
    assert not verdict(check_predict_sharpness, 1.0)[0]  # "the best key takes everything"
    for slip, words in ((1.0, "a hard lookup"), (0.48, "counts eight other keys"), (0.125, "a uniform row"),
                        (math.e / (math.e + 7), "already divided by sqrt(D)"), (2 / 9, "not score / sum"),
                        (0.88, "counts one other key"), (0.25, "divides the score by the number of keys"),
                        (7.39, "at most 1")):
        ok, line = verdict(check_predict_sharpness, slip)
        assert not ok and words in line, line
