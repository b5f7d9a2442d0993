"""Exercise checks of lesson 13 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import torch

from helpers.checks._core import Bug, Case, CheckResult, check
from helpers.masks import causal_mask

__all__ = ["check_batched_previous_token_score", "check_induction_score", "check_zero_head_hook",
           "check_ablation_table"]


def _weights(seed: int, *shape, causal: bool = True) -> torch.Tensor:
    """Lively attention weights: rows sum to 1, causal unless asked otherwise."""
    g = torch.Generator().manual_seed(seed)
    T = shape[-1]
    scores = 2 * torch.randn(*shape, generator=g)
    if causal:
        scores = scores.masked_fill(~causal_mask(T), float("-inf"))
    return scores.softmax(-1)


def _prev_ref(w):
    from helpers.heads import previous_token_score

    return previous_token_score(w)


def _batched(w):
    return w if w.dim() == 4 else w[None]


def check_batched_previous_token_score(fn) -> CheckResult:
    """Check ``previous_token_score(weights (B, H, T, T) or (H, T, T)) -> (H,)``, batched (lesson 13)."""
    cases = [Case("weights (2, 3, 6, 6)", (_weights(0, 2, 3, 6, 6),)),
             Case("weights (4, 4, 10, 10)", (_weights(1, 4, 4, 10, 10),)),
             Case("weights (3, 5, 5) with no batch axis", (_weights(2, 3, 5, 5),)),
             Case("bidirectional weights (2, 2, 7, 7)", (_weights(3, 2, 2, 7, 7, causal=False),))]
    bugs = [Bug("that is each query's weight on itself (the main diagonal): the previous token of query i is "
                "key i - 1, diagonal(offset=-1)", lambda w: _batched(w).diagonal(0, -2, -1).mean(dim=(0, 2))),
            Bug("that reads key i + 1 (diagonal(offset=1), the future): the previous token is key i - 1, offset=-1",
                lambda w: _batched(w).diagonal(1, -2, -1).mean(dim=(0, 2))),
            Bug("query 0 was counted with a weight of 0: it has no previous token, so average over queries 1..T-1 "
                "only", lambda w: _batched(w).diagonal(-1, -2, -1).sum(-1).mean(0) / w.shape[-1]),
            Bug("that is a sum over the queries; the score is the mean over queries 1..T-1 and the batch",
                lambda w: _batched(w).diagonal(-1, -2, -1).sum(-1).mean(0)),
            Bug("the batch axis is still there: average over the batch too, for one score per head",
                lambda w: w.diagonal(-1, -2, -1).mean(-1))]
    return check("previous_token_score", fn, _prev_ref, cases, bugs=bugs, atol=1e-6)


def _ind_ref(w, period):
    from helpers.heads import induction_score

    return induction_score(w, period)


def _diag_mean(w, offset, first):
    """Mean over the batch and queries i >= first of w[..., i, i - offset]."""
    d = _batched(w).diagonal(-offset, -2, -1)  # entry k is query offset + k
    return d[..., first - offset:].mean(dim=(0, 2))


def check_induction_score(fn) -> CheckResult:
    """Check ``induction_score(weights (B, H, T, T) or (H, T, T), period) -> (H,)`` (lesson 13)."""
    cases = [Case("weights (2, 3, 12, 12), period 4", (_weights(4, 2, 3, 12, 12), 4)),
             Case("weights (3, 2, 9, 9), period 3", (_weights(5, 3, 2, 9, 9), 3)),
             Case("weights (4, 16, 16) with no batch axis, period 7", (_weights(6, 4, 16, 16), 7)),
             Case("weights (1, 2, 10, 10), period 9 (one repeated query)", (_weights(7, 1, 2, 10, 10), 9))]
    bugs = [Bug("off by one: that is the weight on the earlier copy of the current token itself (key i - period); "
                "an induction head looks at the token AFTER it, key i - period + 1",
                lambda w, p: _diag_mean(w, p, p)),
            Bug("that is the token after the one after (key i - period + 2): the token after the earlier copy is "
                "key i - period + 1", lambda w, p: _diag_mean(w, p - 2, p) if p >= 2 else _diag_mean(w, 0, p)),
            Bug("the queries start one too early (at period - 1, whose token has not repeated yet): average over "
                "queries i = period..T-1", lambda w, p: _diag_mean(w, p - 1, p - 1)),
            Bug("that is the previous-token score (key i - 1): the induction key is i - period + 1",
                lambda w, p: _diag_mean(w, 1, 1))]
    return check("induction_score", fn, _ind_ref, cases, bugs=bugs, atol=1e-6, strict_types=False)


def _mha(seed: int, d_model: int = 16, n_heads: int = 4):
    from helpers.attention import MultiHeadAttention

    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads).eval()


def _hooked_out(make_hook, mha, x, head):
    handle = mha.w_o.register_forward_pre_hook(make_hook(head, mha.head_dim))
    try:
        with torch.no_grad():
            return mha(x, x, x, mask=causal_mask(x.shape[1]))[0]
    finally:
        handle.remove()


def _zero_head_ref(head, head_dim):
    def hook(module, args):
        x = args[0].clone()  # (B, T, H*D)
        x[..., head * head_dim:(head + 1) * head_dim] = 0.0
        return (x,)
    return hook


def _slice_bug(pick):
    def make(head, head_dim):
        def hook(module, args):
            x = args[0].clone()
            pick(x, head, head_dim)
            return (x,)
        return hook
    return make


def check_zero_head_hook(make_hook) -> CheckResult:
    """Check ``zero_head_hook(head, head_dim)``: a forward pre-hook for W_O that silences one head (lesson 13)."""
    g = torch.Generator().manual_seed(13)
    cases = [Case(f"MultiHeadAttention(16, 4), T={T}, head {h}", (_mha(h), torch.randn(2, T, 16, generator=g), h))
             for h, T in ((0, 5), (2, 7), (3, 4))]
    cases.append(Case("MultiHeadAttention(24, 3), head 1", (_mha(9, 24, 3), torch.randn(1, 6, 24, generator=g), 1)))

    def run(mha, x, head):
        hook = make_hook(head, mha.head_dim)
        if hook is None:
            return None
        if not callable(hook):
            raise TypeError(f"zero_head_hook must return a hook function, got {type(hook).__name__}")
        return _hooked_out(lambda h, d: hook, mha, x, head)

    def ref(mha, x, head):
        return _hooked_out(_zero_head_ref, mha, x, head)

    def bug(make):
        return lambda mha, x, head: _hooked_out(make, mha, x, head)

    def one_column(x, h, d):
        x[..., h] = 0.0

    def positions(x, h, d):
        x[:, h * d:(h + 1) * d] = 0.0

    def others(x, h, d):
        keep = x[..., h * d:(h + 1) * d].clone()
        x.zero_()
        x[..., h * d:(h + 1) * d] = keep

    def next_head(x, h, d):
        x[..., (h + 1) * d:(h + 2) * d] = 0.0

    bugs = [Bug("only one column was zeroed: head h owns the D columns h*D to (h+1)*D - 1 of W_O's input",
                bug(_slice_bug(one_column))),
            Bug("the slice ran over positions (axis 1), not features: index the last axis, x[..., h*D:(h+1)*D]",
                bug(_slice_bug(positions))),
            Bug("that keeps head h and silences all the others: zero head h's columns only",
                bug(_slice_bug(others))),
            Bug("that silences head h + 1: heads are numbered from 0, so head h starts at column h*D",
                bug(_slice_bug(next_head)))]
    return check("zero_head_hook", run if callable(make_hook) else make_hook, ref, cases, bugs=bugs, atol=1e-6,
                 layouts=False)


def _lively_model(seed: int, n_heads: int):
    from helpers.heads import AttentionOnly, AttentionOnlyConfig

    torch.manual_seed(seed)
    model = AttentionOnly(AttentionOnlyConfig(10, 16, n_heads, 2, 14)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))  # heads that matter unequally, without training
    return model


def _table(model, ids, periods, which=1, cumulative=False):
    from helpers.heads import attention_modules, copy_accuracy

    modules = attention_modules(model)
    out = torch.zeros(len(modules), modules[0].n_heads)  # (L, H)
    for layer, m in enumerate(modules):
        for head in range(m.n_heads):
            heads = [(layer, h) for h in range(head + 1)] if cumulative else [(layer, head)]
            out[layer, head] = copy_accuracy(model, ids, periods, ablate=heads)[which]
    return out


def _ablation_table_ref(model, ids, periods):
    return _table(model, ids, periods)


def check_ablation_table(fn) -> CheckResult:
    """Check ``ablation_table(model, ids, periods) -> (L, H)``: accuracy left with each head zeroed (lesson 13)."""
    from helpers.heads import repeated_tokens

    cases = []
    for seed, n_heads in ((0, 2), (1, 4), (2, 4)):
        ids, periods = repeated_tokens(64, 14, 10, 3, 6, generator=torch.Generator().manual_seed(seed))
        cases.append(Case(f"a 2-layer model with {n_heads} heads per layer (seed {seed})",
                          (_lively_model(seed, n_heads), ids, periods)))

    def baseline_minus(model, ids, periods):
        from helpers.heads import copy_accuracy

        return copy_accuracy(model, ids, periods)[1] - _table(model, ids, periods)

    bugs = [Bug("that is the first copy's accuracy: the second copy (copy_accuracy(...)[1]) is where copying counts",
                lambda m, i, p: _table(m, i, p, which=0)),
            Bug("the heads were ablated cumulatively (heads 0..h together): ablate one head at a time",
                lambda m, i, p: _table(m, i, p, cumulative=True)),
            Bug("that is the drop in accuracy; the table holds the accuracy left after each ablation",
                baseline_minus),
            Bug("rows must be layers and columns heads: (L, H), not (H, L)", lambda m, i, p: _table(m, i, p).T)]
    return check("ablation_table", fn, _ablation_table_ref, cases, bugs=bugs, layouts=False, atol=1e-6)
