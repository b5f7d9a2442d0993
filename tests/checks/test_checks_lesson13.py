"""Lesson 13's checks: right answers pass, stubs say so, the likely mistakes are named, no traceback escapes."""

import pytest
import torch

from helpers.checks import (
    check_induction_score,
    check_most_harmful_head,
    check_previous_token_score,
    check_zero_head_hook,
)
from helpers.heads import AttentionOnlyConfig, copy_accuracy, repeated_tokens


def previous_token_score(weights):
    w = weights if weights.dim() == 4 else weights[None]
    T = w.shape[-1]
    return torch.stack([w[:, :, i, i - 1] for i in range(1, T)], dim=-1).mean(dim=(0, 2))


def test_previous_token_score(accepts, rejects):
    accepts(check_previous_token_score, previous_token_score,
            "✓ previous_token_score: matches the reference on all 4 cases")
    rejects(check_previous_token_score, lambda w: None, "not implemented yet")
    rejects(check_previous_token_score, lambda w: (w if w.dim() == 4 else w[None]).diagonal(0, -2, -1).mean((0, 2)),
            "main diagonal")
    rejects(check_previous_token_score, lambda w: (w if w.dim() == 4 else w[None]).diagonal(1, -2, -1).mean((0, 2)),
            "the future")
    rejects(check_previous_token_score,
            lambda w: (w if w.dim() == 4 else w[None]).diagonal(-1, -2, -1).sum(-1).mean(0) / w.shape[-1],
            "queries 1..T-1")
    rejects(check_previous_token_score, lambda w: previous_token_score(w) * (w.shape[-1] - 1), "sum over the queries")
    rejects(check_previous_token_score, lambda w: previous_token_score(w).mean(), "shape")
    rejects(check_previous_token_score, lambda w: 1 / 0, "ZeroDivisionError")


def induction_score(weights, period):
    w = weights if weights.dim() == 4 else weights[None]
    T = w.shape[-1]
    return torch.stack([w[:, :, i, i - period + 1] for i in range(period, T)], dim=-1).mean(dim=(0, 2))


def _shifted(shift, start_shift=0):
    def fn(weights, period):
        w = weights if weights.dim() == 4 else weights[None]
        T = w.shape[-1]
        return torch.stack([w[:, :, i, i - period + 1 + shift] for i in range(period + start_shift, T)],
                           dim=-1).mean(dim=(0, 2))
    return fn


def test_induction_score(accepts, rejects):
    accepts(check_induction_score, induction_score, "✓ induction_score: matches the reference on all 4 cases")
    rejects(check_induction_score, lambda w, p: None, "not implemented yet")
    line = rejects(check_induction_score, _shifted(-1), "off by one")
    assert "earlier copy of the current token itself" in line
    rejects(check_induction_score, _shifted(+1), "i - period + 2")
    rejects(check_induction_score, _shifted(0, start_shift=-1), "start one too early")
    rejects(check_induction_score,
            lambda w, p: (w if w.dim() == 4 else w[None]).diagonal(-1, -2, -1).mean((0, 2)), "previous-token score")
    rejects(check_induction_score, lambda w, p: induction_score(w, p) + 0.01, "✗")


def zero_head_hook(head, head_dim):
    def hook(module, args):
        x = args[0].clone()
        x[..., head * head_dim:(head + 1) * head_dim] = 0
        return (x,)
    return hook


def _hook_with(edit):
    def make(head, head_dim):
        def hook(module, args):
            x = args[0].clone()
            edit(x, head, head_dim)
            return (x,)
        return hook
    return make


def test_zero_head_hook(accepts, rejects):
    accepts(check_zero_head_hook, zero_head_hook, "✓ zero_head_hook: matches the reference on all 4 cases")
    rejects(check_zero_head_hook, lambda h, d: None, "not implemented yet")

    def in_place(head, head_dim):  # editing the input in place works too: it is a fresh tensor inside the module
        def hook(module, args):
            args[0][..., head * head_dim:(head + 1) * head_dim] = 0
        return hook

    accepts(check_zero_head_hook, in_place)
    rejects(check_zero_head_hook, _hook_with(lambda x, h, d: x.__setitem__((..., h), 0.0)), "only one column")
    rejects(check_zero_head_hook, _hook_with(lambda x, h, d: x.__setitem__((slice(None), slice(h * d, h * d + d)),
                                                                          0.0)), "positions")
    rejects(check_zero_head_hook, _hook_with(lambda x, h, d: x.__setitem__((..., slice((h + 1) * d, (h + 2) * d)),
                                                                          0.0)), "head h + 1")

    def keeps(x, h, d):
        kept = x[..., h * d:(h + 1) * d].clone()
        x.zero_()
        x[..., h * d:(h + 1) * d] = kept

    rejects(check_zero_head_hook, _hook_with(keeps), "silences all the others")
    rejects(check_zero_head_hook, _hook_with(lambda x, h, d: x.mul_(0.5)), "✗")
    rejects(check_zero_head_hook, lambda h, d: "not a hook", "✗")


@pytest.fixture(scope="module")
def trained():
    """A small 2-layer model after a short training: cheap, and its heads already differ."""
    from helpers.heads import train_copying

    cfg = AttentionOnlyConfig(12, 16, 2, 2, 16)
    model, _ = train_copying(cfg, 120, batch=16, lr=3e-3, periods=(3, 8), progress=False, eval_every=120)
    ids, periods = repeated_tokens(128, 16, 12, 3, 8, generator=torch.Generator().manual_seed(3))
    return model.eval(), ids, periods


def test_most_harmful_head(trained, accepts, rejects):
    model, ids, periods = trained
    after = {(layer, head): copy_accuracy(model, ids, periods, ablate=[(layer, head)])[1]
             for layer in range(2) for head in range(2)}
    worst = min(after, key=after.get)
    accepts(lambda p: check_most_harmful_head(p, model, ids, periods), worst)
    rejects(lambda p: check_most_harmful_head(p, model, ids, periods), None, "write your prediction first")
    rejects(lambda p: check_most_harmful_head(p, model, ids, periods), (2, 0), "(layer, head) pair")
    rejects(lambda p: check_most_harmful_head(p, model, ids, periods), 3, "(layer, head) pair")
    other_layer = next(pair for pair in after if pair[0] != worst[0])
    same_layer = next(pair for pair in after if pair[0] == worst[0] and pair != worst)
    rejects(lambda p: check_most_harmful_head(p, model, ids, periods), same_layer, "right layer")
    line = rejects(lambda p: check_most_harmful_head(p, model, ids, periods), other_layer, "✗")
    if worst[0] == 0:
        assert "share the work" in line
