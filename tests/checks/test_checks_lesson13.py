"""Lesson 13's checks: right answers pass, stubs say so, the likely mistakes are named, no traceback escapes."""

import torch

from helpers.checks import (
    check_ablation_table,
    check_batched_previous_token_score,
    check_induction_score,
    check_zero_head_hook,
)
from helpers.heads import attention_modules, copy_accuracy


def previous_token_score(weights):
    w = weights if weights.dim() == 4 else weights[None]
    T = w.shape[-1]
    return torch.stack([w[:, :, i, i - 1] for i in range(1, T)], dim=-1).mean(dim=(0, 2))


CHECK_PREV = check_batched_previous_token_score


def test_previous_token_score(accepts, rejects):
    accepts(check_batched_previous_token_score, previous_token_score,
            "✓ previous_token_score: matches the reference on all 4 cases")
    rejects(CHECK_PREV, lambda w: None, "not implemented yet")
    rejects(CHECK_PREV, lambda w: (w if w.dim() == 4 else w[None]).diagonal(0, -2, -1).mean((0, 2)),
            "main diagonal")
    rejects(CHECK_PREV, lambda w: (w if w.dim() == 4 else w[None]).diagonal(1, -2, -1).mean((0, 2)),
            "the future")
    rejects(CHECK_PREV,
            lambda w: (w if w.dim() == 4 else w[None]).diagonal(-1, -2, -1).sum(-1).mean(0) / w.shape[-1],
            "queries 1..T-1")
    rejects(CHECK_PREV, lambda w: previous_token_score(w) * (w.shape[-1] - 1), "sum over the queries")
    rejects(CHECK_PREV, lambda w: previous_token_score(w).mean(), "shape")
    rejects(CHECK_PREV, lambda w: w.diagonal(-1, -2, -1).mean(-1), "average over the batch")
    rejects(CHECK_PREV, lambda w: 1 / 0, "ZeroDivisionError")


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


def ablation_table(model, ids, periods):
    modules = attention_modules(model)
    table = torch.zeros(len(modules), modules[0].n_heads)
    for layer, attn in enumerate(modules):
        for head in range(attn.n_heads):
            table[layer, head] = copy_accuracy(model, ids, periods, ablate=[(layer, head)])[1]
    return table


def test_ablation_table(accepts, rejects):
    accepts(check_ablation_table, ablation_table, "✓ ablation_table: matches the reference on all 3 cases")
    rejects(check_ablation_table, lambda m, i, p: None, "not implemented yet")

    def first_copy(model, ids, periods):
        modules = attention_modules(model)
        return torch.tensor([[copy_accuracy(model, ids, periods, ablate=[(layer, head)])[0]
                              for head in range(attn.n_heads)] for layer, attn in enumerate(modules)])

    def cumulative(model, ids, periods):
        modules = attention_modules(model)
        return torch.tensor([[copy_accuracy(model, ids, periods, ablate=[(layer, h) for h in range(head + 1)])[1]
                              for head in range(attn.n_heads)] for layer, attn in enumerate(modules)])

    rejects(check_ablation_table, first_copy, "first copy")
    rejects(check_ablation_table, cumulative, "cumulatively")
    rejects(check_ablation_table, lambda m, i, p: copy_accuracy(m, i, p)[1] - ablation_table(m, i, p), "drop")
    rejects(check_ablation_table, lambda m, i, p: ablation_table(m, i, p).T, "(L, H), not (H, L)")
    rejects(check_ablation_table, lambda m, i, p: ablation_table(m, i, p).double(), "dtype")
    rejects(check_ablation_table, lambda m, i, p: torch.zeros(2, 2), "✗")
