"""Checks for the two core functions: stable softmax (lesson 03) and attention (lesson 02)."""

from __future__ import annotations

import torch

from helpers.attention import scaled_dot_product_attention, softmax
from helpers.checks._core import Bug, Case, CheckResult, check, first_output

__all__ = ["check_softmax", "check_attention"]


def check_softmax(fn) -> CheckResult:
    """Check a learner's ``softmax(x)`` over the last dimension, including logits of +-1e4 (lesson 03)."""
    g = torch.Generator().manual_seed(0)
    cases = [
        Case("a (3, 5) tensor of small logits", (torch.randn(3, 5, generator=g),)),
        Case("a (2, 4, 6) tensor", (torch.randn(2, 4, 6, generator=g),)),
        Case("logits of size +-1e4 (naive exp overflows)", (torch.randn(4, 7, generator=g) * 1e4,)),
        Case("a row of equal logits", (torch.full((1, 5), 3.0),)),
    ]
    bugs = [Bug("exp overflows for large logits: subtract the row max before exp",
                lambda x: torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True)),
            Bug("your softmax runs over the first dimension: normalise over the last one (dim=-1)",
                lambda x: torch.softmax(x, dim=0)),
            Bug("you divide by the sum over the whole tensor: each row is normalised by its own sum, "
                "sum(dim=-1, keepdim=True)", lambda x: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum()),
            Bug("the max is subtracted only in the numerator: exp(x - m) / sum(exp(x - m)) needs it in both",
                lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x).sum(-1, keepdim=True)),
            Bug("you subtract the max of the whole tensor: a row far below it underflows to 0 / 0; subtract each "
                "row's own max, x.amax(dim=-1, keepdim=True)",
                lambda x: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(dim=-1, keepdim=True)),
            Bug("that is log_softmax: the softmax is its exp, exp(x - m) / sum(exp(x - m))",
                lambda x: torch.log_softmax(x, dim=-1)),
            Bug("the exp is missing: x / sum(x) is not a softmax; use exp(x - m) / sum(exp(x - m))",
                lambda x: x / x.sum(dim=-1, keepdim=True)),
            Bug("the division by the row sum is missing: exp(x - m) alone does not sum to 1",
                lambda x: torch.exp(x - x.amax(-1, keepdim=True))),
            Bug("your softmax is taken of -x: exp(x - m) / sum(exp(x - m)), without a minus sign",
                lambda x: torch.softmax(-x, dim=-1))]
    return check("softmax", fn, lambda x: softmax(x, dim=-1), cases, bugs=bugs)


def check_attention(fn) -> CheckResult:
    """Check a learner's ``attention(q, k, v)`` output against the course's reference (lesson 02)."""
    g = torch.Generator().manual_seed(1)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    cases = [
        Case("self-attention, q k v of shape (4, 8)", (r(4, 8), r(4, 8), r(4, 8))),
        Case("cross-attention, T=3 queries, S=5 keys", (r(3, 8), r(5, 8), r(5, 8))),
        Case("values wider than keys (Dv=6, D=4)", (r(2, 3, 4), r(2, 5, 4), r(2, 5, 6))),
        Case("batched heads (B=2, H=3, T=4, D=16)", (r(2, 3, 4, 16), r(2, 3, 4, 16), r(2, 3, 4, 16))),
    ]
    bugs = [Bug("your answer has no 1/sqrt(D) scaling of the scores",
                lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v),
            Bug("your softmax runs over the queries (dim -2): each query's row of weights must sum to 1",
                lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-2) @ v),
            Bug("the scores are divided by D: the scaling is 1 / sqrt(D)",
                lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1], dim=-1) @ v),
            Bug("your answer returns the weights: return the output, weights @ v (and the weights second, if "
                "you like)", lambda q, k, v: scaled_dot_product_attention(q, k, v)[1]),
            Bug("your softmax runs over dim 0 (the first leading axis): use dim=-1, the keys, for any number of "
                "leading axes", lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=0) @ v),
            Bug("the scores are divided by sqrt(S), the number of keys: the scaling is 1 / sqrt(D), the width of q",
                lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / k.shape[-2] ** 0.5, dim=-1) @ v),
            Bug("the scores are multiplied by sqrt(D): divide them by it",
                lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** 0.5, dim=-1) @ v),
            Bug("your scores are transposed (K Q^T): row t must hold query t's scores against every key, Q K^T",
                lambda q, k, v: torch.softmax(k @ q.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v),
            Bug("the weights multiply the keys: the output is weights @ v",
                lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ k)]
    return check("attention", fn, lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
                 cases, bugs=bugs, adapt=first_output)
