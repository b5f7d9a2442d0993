"""Exercise checks of lesson 00: the shape notation (each prints one line, returns True/False)."""

from __future__ import annotations

import torch

from helpers.checks._core import Bug, Case, CheckResult, check

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
             Case("x of shape (1, 5, 6), 3 heads",
                  (torch.randn(1, 5, 6, generator=torch.Generator().manual_seed(0)), 3))]
    bugs = [Bug("the values are in the wrong places: view(B, T, H, D) first, then transpose(1, 2); "
                "viewing straight to (B, H, T, D) mixes tokens and features",
                lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h))]
    return check("split_heads", fn, _split, cases, bugs=bugs)


def check_merge_heads(fn) -> CheckResult:
    """Check ``merge_heads(x (B, H, T, D)) -> (B, T, C)``, the inverse of split_heads (lesson 00)."""
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)
    # the checks pass contiguous copies (as attention's output is), and then transposed layouts too
    cases = [Case("the output of split_heads(x (2, 3, 8), 2), made contiguous", (_split(x, 2),)),
             Case("the output of split_heads(x (2, 3, 8), 4), made contiguous", (_split(x, 4),))]
    bugs = [Bug("the transpose is missing: move H back next to D with transpose(1, 2) before merging",
                lambda x: x.reshape(x.shape[0], x.shape[2], -1))]
    return check("merge_heads", fn, _merge, cases, bugs=bugs)


def check_scores_shape(fn) -> CheckResult:
    """Check ``scores_shape(B, H, T, S) -> tuple``, the shape of the attention scores (lesson 00)."""
    cases = [Case("B=2, H=4, T=3, S=5", (2, 4, 3, 5)), Case("B=1, H=8, T=7, S=7", (1, 8, 7, 7))]

    def as_tuple(got, expected):
        return tuple(got) if isinstance(got, (tuple, list, torch.Size)) else got

    bugs = [Bug("T and S are swapped: each row of the scores is one query and each column one key, "
                "so the shape is (B, H, T, S), not (B, H, S, T)", lambda B, H, T, S: (B, H, S, T))]
    return check("scores_shape", fn, lambda B, H, T, S: (B, H, T, S), cases, bugs=bugs, adapt=as_tuple)
