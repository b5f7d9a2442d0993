"""Exercise checks of lesson 00: the shape notation (each prints one line, returns True/False)."""

from __future__ import annotations

import torch

from helpers.checks._core import Bug, Case, CheckResult, Reject, check

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
                lambda x, h: x.reshape(x.shape[0], h, x.shape[1], x.shape[2] // h)),
            Bug("the transpose is missing: view(B, T, H, D) gives (B, T, H, D); transpose(1, 2) makes it (B, H, T, D)",
                lambda x, h: x.view(x.shape[0], x.shape[1], h, x.shape[2] // h)),
            Bug("H and D are swapped in the view: view(B, T, H, D), then transpose(1, 2)",
                lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h).transpose(1, 2)),
            Bug("the result is (B, H, D, T): transpose(1, 2) swaps T and H; transposing the last two axes "
                "as well puts D before T", lambda x, h: _split(x, h).transpose(-2, -1)),
            Bug("each head takes every H-th feature: view(B, T, D, H) interleaves them; view(B, T, H, D) gives "
                "head 1 the first D features, head 2 the next D",
                lambda x, h: x.reshape(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2)),
            Bug("transpose(0, 2) moves the batch axis: swap the token and head axes, transpose(1, 2)",
                lambda x, h: x.view(x.shape[0], x.shape[1], h, x.shape[2] // h).transpose(0, 2))]
    return check("split_heads", fn, _split, cases, bugs=bugs)


def check_merge_heads(fn) -> CheckResult:
    """Check ``merge_heads(x (B, H, T, D)) -> (B, T, C)``, the inverse of split_heads (lesson 00)."""
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)
    # the checks pass contiguous copies (as attention's output is), and then transposed layouts too
    cases = [Case("the output of split_heads(x (2, 3, 8), 2), made contiguous", (_split(x, 2),)),
             Case("the output of split_heads(x (2, 3, 8), 4), made contiguous", (_split(x, 4),))]
    bugs = [Bug("the transpose is missing: move H back next to D with transpose(1, 2) before merging",
                lambda x: x.reshape(x.shape[0], x.shape[2], -1)),
            Bug("the heads are merged in the wrong order: transpose(1, 2) gives (B, T, H, D), so each token's "
                "features are head 0's D, then head 1's; a transpose of the last two axes mixes D and H",
                lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1)),
            Bug("the result is (B, H * D, T) or another order: the merged shape is (B, T, H * D)",
                lambda x: _merge(x).transpose(1, 2)),
            Bug("the token axis is gone: reshape(B, -1) flattens the tokens too; the merged shape is (B, T, H * D)",
                lambda x: _merge(x).reshape(x.shape[0], -1)),
            Bug("transpose(1, 2) alone gives (B, T, H, D): merge the last two axes with reshape(B, T, H * D)",
                lambda x: x.transpose(1, 2))]
    return check("merge_heads", fn, _merge, cases, bugs=bugs)


def check_scores_shape(fn) -> CheckResult:
    """Check ``scores_shape(B, H, T, S) -> tuple``, the shape of the attention scores (lesson 00)."""
    cases = [Case("B=2, H=4, T=3, S=5", (2, 4, 3, 5)), Case("B=1, H=8, T=7, S=7", (1, 8, 7, 7))]

    def as_tuple(got, expected):
        if isinstance(got, torch.Tensor) and got.dim() == 4:
            return Reject("return the shape (a tuple of 4 ints), not a tensor of that shape: use tuple(...) or .shape")
        if isinstance(got, str):
            return Reject(f"return a tuple of 4 ints, not a string (got {got[:30]!r}): (B, H, T, S) without quotes")
        return tuple(got) if isinstance(got, (tuple, list, torch.Size)) else got

    bugs = [Bug("T and S are swapped: each row of the scores is one query and each column one key, "
                "so the shape is (B, H, T, S), not (B, H, S, T)", lambda B, H, T, S: (B, H, S, T)),
            Bug("the head axis is missing: every head has its own scores, so the shape is (B, H, T, S)",
                lambda B, H, T, S: (B, T, S)),
            Bug("H comes second: the heads were moved next to the batch by transpose(1, 2), so the shape is "
                "(B, H, T, S), not (B, T, H, S)", lambda B, H, T, S: (B, T, H, S)),
            Bug("the last axis counts the keys, S: the scores are (B, H, T, S), which is (B, H, T, T) only "
                "in self-attention", lambda B, H, T, S: (B, H, T, T)),
            Bug("the batch and head axes are merged into one: keep them apart, (B, H, T, S)",
                lambda B, H, T, S: (B * H, T, S)),
            Bug("the batch axis is missing: every sequence of the batch has its own scores, (B, H, T, S)",
                lambda B, H, T, S: (H, T, S)),
            Bug("that is the number of scores, B * H * T * S: return the shape, the tuple (B, H, T, S)",
                lambda B, H, T, S: B * H * T * S)]
    return check("scores_shape", fn, lambda B, H, T, S: (B, H, T, S), cases, bugs=bugs, adapt=as_tuple)
