"""Exercise checks of lesson 00: the shape notation (each prints one line, returns True/False)."""

from __future__ import annotations

import torch

from helpers.checks._core import Case, CheckResult, run_check

__all__ = ["check_split_heads", "check_merge_heads", "check_scores_shape"]


def _split(x, n_heads):
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)  # (B, T, C) -> (B, H, T, D)


def _merge(x):
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)  # (B, H, T, D) -> (B, T, C)


def check_split_heads(fn) -> CheckResult:
    """Check ``split_heads(x (B, T, C), n_heads) -> (B, H, T, D)`` (lesson 00)."""
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)
    cases = [Case("x of shape (2, 3, 8), 2 heads", (x, 2)), Case("x of shape (2, 3, 8), 4 heads", (x, 4)),
             Case("x of shape (1, 5, 6), 3 heads", (torch.randn(1, 5, 6), 3))]
    return run_check("split_heads", fn, _split, cases)


def check_merge_heads(fn) -> CheckResult:
    """Check ``merge_heads(x (B, H, T, D)) -> (B, T, C)``, the inverse of split_heads (lesson 00)."""
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)
    cases = [Case("the output of split_heads(x (2, 3, 8), 2)", (_split(x, 2),)),
             Case("the output of split_heads(x (2, 3, 8), 4)", (_split(x, 4),))]
    return run_check("merge_heads", fn, _merge, cases)


def check_scores_shape(fn) -> CheckResult:
    """Check ``scores_shape(B, H, T, S) -> tuple``, the shape of the attention scores (lesson 00)."""
    cases = [Case("B=2, H=4, T=3, S=5", (2, 4, 3, 5)), Case("B=1, H=8, T=7, S=7", (1, 8, 7, 7))]
    return run_check("scores_shape", lambda *a: None if fn(*a) is None else tuple(fn(*a)),
                     lambda B, H, T, S: (B, H, T, S), cases)
