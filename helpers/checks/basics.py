"""Checks for the two core functions: stable softmax (lesson 03) and attention (lesson 02)."""

from __future__ import annotations

import torch

from helpers.attention import scaled_dot_product_attention, softmax
from helpers.checks._core import Case, CheckResult, run_check

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
    return run_check("softmax", fn, lambda x: softmax(x, dim=-1), cases)


def _first(got, expected):
    """Accept either `out` or `(out, weights)` from the learner; compare the output."""
    out = got[0] if isinstance(got, (tuple, list)) else got
    return out


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
    return run_check("attention", fn, lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
                     cases, adapt=_first)
