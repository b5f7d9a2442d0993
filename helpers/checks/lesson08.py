"""Exercise checks of lesson 08: the encoder-decoder Transformer (each prints one line, returns True/False)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.checks._core import Bug, Case, CheckResult, Reject, check

__all__ = ["check_teacher_forcing", "check_decoder_self_mask", "check_greedy_step", "check_length_normalised_score",
           "check_label_smoothed_loss"]


def _teacher_forcing(tgt):
    return tgt[:, :-1], tgt[:, 1:]  # (B, T + 1) -> (B, T), (B, T)


def check_teacher_forcing(fn) -> CheckResult:
    """Check ``teacher_forcing(tgt (B, T + 1)) -> (decoder_input (B, T), labels (B, T))`` (lesson 08)."""
    framed = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])  # <s> ... </s>, then a pad
    cases = [Case("two targets framed by <s>=1 and </s>=2, the second padded with 0", (framed,)),
             Case("one target of 12 ids (a date: <s>, 10 characters, </s>)",
                  (torch.tensor([[1, 5, 12, 12, 4, 3, 3, 6, 3, 7, 8, 2]]),))]
    bugs = [Bug("the two are swapped: the decoder reads tgt[:, :-1] and learns to predict tgt[:, 1:]",
                lambda t: (t[:, 1:], t[:, :-1])),
            Bug("the decoder input must have T tokens, not T + 1: drop the last token, tgt[:, :-1]",
                lambda t: (t, t[:, 1:])),
            Bug("the labels are not shifted: the decoder reads tgt[:, :-1] and must predict the NEXT token, "
                "tgt[:, 1:]", lambda t: (t[:, :-1], t[:, :-1])),
            Bug("the input keeps </s> and drops <s>: the decoder starts from <s>, so its input is tgt[:, :-1]",
                lambda t: (t[:, 1:], t[:, 1:])),
            Bug("you sliced the batch axis (tgt[:-1]): slice the time axis, tgt[:, :-1] and tgt[:, 1:]",
                lambda t: (t[:-1], t[1:])),
            Bug("the labels must have T tokens, one per decoder input: cut the first, tgt[:, 1:]",
                lambda t: (t[:, :-1], t)),
            Bug("both are shifted one step too far: the decoder input starts with <s>, tgt[:, :-1], and the labels "
                "are the next tokens, tgt[:, 1:]", lambda t: (t[:, 1:-1], t[:, 2:]))]
    return check("teacher_forcing", fn, _teacher_forcing, cases, bugs=bugs)


def _decoder_self_mask(tgt, pad_id):
    T = tgt.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril()  # (T, T)
    return causal & (tgt != pad_id)[:, None, None, :]  # (T, T) & (B, 1, 1, T) -> (B, 1, T, T)


def check_decoder_self_mask(fn) -> CheckResult:
    """Check ``decoder_self_mask(tgt (B, T), pad_id) -> (B, 1, T, T)`` bool, True = may attend (lesson 08)."""
    cases = [Case("one target without padding, T=4", (torch.tensor([[1, 5, 6, 7]]), 0)),
             Case("two targets, the second ending in two pads (pad_id=0): pads must be hidden as keys",
                  (torch.tensor([[1, 5, 6, 7, 8], [1, 9, 4, 0, 0]]), 0)),
             Case("pad_id=3 instead of 0", (torch.tensor([[1, 5, 3], [1, 3, 3]]), 3))]

    bugs = [Bug("the padding is missing: pads must also be hidden as keys, causal & (tgt != pad_id)[:, None, None, :]",
                lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).tril().expand(t.shape[0], 1, -1, -1)),
            Bug("the causal part is missing: query t must not see keys after t",
                lambda t, p: (t != p)[:, None, None, :].expand(-1, 1, t.shape[1], -1)),
            Bug("polarity flipped: True must mean 'may attend'", lambda t, p: ~_decoder_self_mask(t, p)),
            # With right padding, hiding pads as queries only and as queries and keys give the same mask.
            Bug("you hid the pads as queries (rows); hide them as keys (columns) instead, with "
                "(tgt != pad_id)[:, None, None, :]. A pad's own row must still see the real tokens before it, "
                "or it is fully masked",
                lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).tril() & (t != p)[:, None, :, None]),
            Bug("triu keeps the upper triangle, the future: query t may see keys j <= t, the lower triangle, tril()",
                lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).triu() & (t != p)[:, None, None, :]),
            Bug("tril(-1) drops the diagonal: a token may attend to itself, so use tril() (diagonal 0)",
                lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).tril(-1)
                & (t != p)[:, None, None, :]),
            Bug("the mask is (B, T, T): add the head axis, (B, 1, T, T), so that it broadcasts over the heads",
                lambda t, p: _decoder_self_mask(t, p)[:, 0]),
            Bug("the padding is missing: pads must also be hidden as keys, causal & (tgt != pad_id)[:, None, None, :]",
                lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).tril()[None, None]),
            Bug("you hid the pads as queries (rows) as well as keys: hide them as keys (columns) only, with "
                "(tgt != pad_id)[:, None, None, :]. A pad's own row must still see the real tokens before it, "
                "or it is fully masked",
                lambda t, p: _decoder_self_mask(t, p) & (t != p)[:, None, :, None]),
            Bug("the padding part is flipped: tgt != pad_id is True for real tokens, which may be attended to",
                lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).tril() & (t == p)[:, None, None, :]),
            Bug("you compare with 0 whatever pad_id is: use tgt != pad_id",
                lambda t, p: _decoder_self_mask(t, 0))]
    return check("decoder_self_mask", fn, _decoder_self_mask, cases, bugs=bugs)


def _greedy_step(logits, ys, finished, eos_id, pad_id, pad_finished=True, keep_finished=True, prepend=False,
                 fill=None, previous=False):
    """One step of batched greedy decoding; the keywords reproduce typical slips when changed."""
    best = logits.argmax(dim=-1)  # (B, V) -> (B,)
    if pad_finished:  # a finished sequence only grows pads
        best = torch.where(finished, torch.full_like(best, pad_id if fill is None else fill), best)
    parts = (best[:, None], ys) if prepend else (ys, best[:, None])
    done = (ys[:, -1] if previous else best) == eos_id
    return torch.cat(parts, dim=1), (finished | done) if keep_finished else done  # (B, t + 1), (B,)


def check_greedy_step(fn) -> CheckResult:
    """Check ``greedy_step(logits (B, V), ys (B, t), finished (B,), eos_id, pad_id) -> (ys, finished)`` (lesson 08)."""
    g = torch.Generator().manual_seed(8)
    cases = [Case("B=1, V=6, the first step after <s> (ys = [[1]])",
                  (torch.randn(1, 6, generator=g), torch.tensor([[1]]), torch.tensor([False]), 2, 0)),
             Case("B=3, V=6: row 0 picks </s>=2 now, row 2 finished earlier (pad_id=0)",
                  (torch.tensor([[0.0, 0.1, 3.0, 0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 2.0, 0.0],
                                 [0.0, 0.0, 0.0, 5.0, 0.0, 0.0]]),
                   torch.tensor([[1, 4, 5], [1, 3, 3], [1, 2, 0]]), torch.tensor([False, False, True]), 2, 0)),
             Case("B=4, V=9, eos_id=8, pad_id=7, rows 1 and 3 finished earlier",
                  (torch.randn(4, 9, generator=g) * 3,
                   torch.tensor([[1, 4], [1, 8], [1, 5], [8, 7]]), torch.tensor([False, True, False, True]), 8, 7))]
    bugs = [Bug("a sequence that has finished must only grow pad_id: replace its new token with pad_id "
                "(torch.where(finished, pad_id, best))",
                lambda lg, ys, f, e, p: _greedy_step(lg, ys, f, e, p, pad_finished=False)),
            Bug("finished must stay True once set: finished | (new token == eos_id)",
                lambda lg, ys, f, e, p: _greedy_step(lg, ys, f, e, p, keep_finished=False)),
            Bug("finished is returned unchanged: a row whose new token is eos_id has finished",
                lambda lg, ys, f, e, p: (_greedy_step(lg, ys, f, e, p)[0], f)),
            Bug("the new token goes at the end of ys, torch.cat((ys, best[:, None]), dim=1), not in front",
                lambda lg, ys, f, e, p: _greedy_step(lg, ys, f, e, p, prepend=True)),
            Bug("a finished row grows pad_id, not eos_id: torch.where(finished, pad_id, best)",
                lambda lg, ys, f, e, p: _greedy_step(lg, ys, f, e, p, fill=e)),
            Bug("finished must come from the NEW token: finished | (best == eos_id); you looked at the last token "
                "of ys", lambda lg, ys, f, e, p: _greedy_step(lg, ys, f, e, p, previous=True))]

    def order_first(got, expected):
        if isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got) \
                and got[0].dtype == torch.bool and got[1].dtype != torch.bool:
            return Reject("return (ys, finished) in that order: ys first, then the boolean finished")
        return got

    return check("greedy_step", fn, _greedy_step, cases, bugs=bugs, adapt=order_first)


def _length_normalised_score(log_prob, length, alpha):
    return log_prob / ((5 + length) / 6) ** alpha  # Wu et al. 2016, Eq. 14


def check_length_normalised_score(fn) -> CheckResult:
    """Check ``length_normalised_score(log_prob, length, alpha)``, Wu et al. 2016 Eq. 14 (lesson 08)."""
    cases = [Case("log_prob=-3.0, length=11, alpha=0.6", (-3.0, 11, 0.6)),
             Case("log_prob=-3.0, length=1, alpha=0.6 (a one-token hypothesis: the penalty is 1)", (-3.0, 1, 0.6)),
             Case("alpha=0: no normalisation at all", (-2.5, 7, 0.0)),
             Case("tensors: log_prob (3,), length (3,), alpha=1.0",
                  (torch.tensor([-1.0, -4.0, -0.5], dtype=torch.float64),
                   torch.tensor([2, 10, 30], dtype=torch.float64), 1.0))]
    bugs = [Bug("that divides by length ** alpha; Wu et al.'s penalty is ((5 + length) / 6) ** alpha",
                lambda lp, n, a: lp / n ** a),
            Bug("the penalty multiplies; the log-probability is divided by ((5 + length) / 6) ** alpha",
                lambda lp, n, a: lp * ((5 + n) / 6) ** a),
            Bug("operator precedence: (5 + length) / 6 ** alpha raises only the 6 to alpha; bracket the "
                "fraction, ((5 + length) / 6) ** alpha", lambda lp, n, a: lp / ((5 + n) / 6 ** a)),
            Bug("operator precedence: log_prob / (5 + length) / 6 ** alpha divides twice; write "
                "log_prob / ((5 + length) / 6) ** alpha", lambda lp, n, a: lp / (5 + n) / 6 ** a),
            Bug("the constant is 5 + length, not 1 + length: ((5 + length) / 6) ** alpha",
                lambda lp, n, a: lp / ((1 + n) / 6) ** a),
            Bug("alpha is missing: the penalty is ((5 + length) / 6) ** alpha", lambda lp, n, a: lp / ((5 + n) / 6)),
            Bug("operator precedence: (5 + length) ** alpha / 6 raises only 5 + length to alpha; bracket the "
                "fraction, ((5 + length) / 6) ** alpha", lambda lp, n, a: lp / ((5 + n) ** a / 6)),
            Bug("you returned the penalty itself; the score is log_prob divided by it",
                lambda lp, n, a: ((5 + n) / 6) ** a),
            Bug("the penalty divides the log-probability; you subtracted it", lambda lp, n, a: lp - ((5 + n) / 6) ** a)]
    # rtol 1e-5: an answer computed in float32 (a tensor made from the Python float) passes, and a value
    # it rejects differs from the reference in the 6 significant digits that the message prints.
    return check("length_normalised_score", fn, _length_normalised_score, cases, bugs=bugs, atol=1e-9, rtol=1e-5)


def _smoothed_loss(logits, labels, eps, pad_id):
    # Szegedy et al. 2016, used by Vaswani et al. 2017 (eps = 0.1): eps / V on every class, 1 - eps on top
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=pad_id, label_smoothing=eps)


def _smoothed_by_hand(logits, labels, eps, pad_id, others=False, skip_pads=True, per_row=False):
    """Label smoothing written out; the keywords reproduce typical slips when changed."""
    V = logits.shape[-1]
    logp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    target = torch.full_like(logp, eps / (V - 1) if others else eps / V)  # (B, T, V)
    target.scatter_(-1, labels[..., None], (1 - eps) if others else (1 - eps + eps / V))
    loss = -(target * logp).sum(dim=-1)  # (B, T)
    real = labels != pad_id if skip_pads else torch.ones_like(labels, dtype=torch.bool)
    if per_row:
        return ((loss * real).sum(dim=1) / real.sum(dim=1)).mean()
    return loss[real].mean()


def _smoothed_kl(logits, labels, eps, pad_id):
    """KL(target || softmax(logits)) over the real positions, the mean of its per-position sums."""
    V = logits.shape[-1]
    target = torch.full_like(logits, eps / V)  # (B, T, V)
    target.scatter_(-1, labels[..., None], 1 - eps + eps / V)
    kl = F.kl_div(torch.log_softmax(logits, dim=-1), target, reduction="none").sum(dim=-1)  # (B, T)
    return kl[labels != pad_id].mean()


def check_label_smoothed_loss(fn) -> CheckResult:
    """Check ``label_smoothed_loss(logits (B, T, V), labels (B, T), eps, pad_id)``, pads ignored (lesson 08)."""
    g = torch.Generator().manual_seed(12)
    labels = torch.tensor([[4, 5, 2, 0, 0], [3, 3, 6, 7, 2]])  # (B, T), row 0 ends in two pads
    cases = [Case("B=1, T=3, V=6, eps=0.1, no padding",
                  (torch.randn(1, 3, 6, generator=g), torch.tensor([[1, 4, 2]]), 0.1, 0)),
             Case("B=2, T=5, V=8, eps=0.1, row 0 ends in two pads (pad_id=0)",
                  (torch.randn(2, 5, 8, generator=g) * 2, labels, 0.1, 0)),
             Case("eps=0: the plain cross-entropy", (torch.randn(2, 5, 8, generator=g), labels, 0.0, 0)),
             Case("eps=0.3 and pad_id=7", (torch.randn(2, 5, 8, generator=g), labels, 0.3, 7))]
    bugs = [Bug("the pads are counted: leave out the positions whose label is pad_id (ignore_index=pad_id)",
                lambda lg, lb, e, p: _smoothed_by_hand(lg, lb, e, p, skip_pads=False)),
            Bug("eps is spread over the V - 1 wrong classes; in the 2017 paper's smoothing (and "
                "label_smoothing=eps) every class gets eps / V and the label 1 - eps + eps / V",
                lambda lg, lb, e, p: _smoothed_by_hand(lg, lb, e, p, others=True)),
            Bug("eps is ignored: this is the plain cross-entropy; mix eps / V on every class into the target",
                lambda lg, lb, e, p: _smoothed_loss(lg, lb, 0.0, p)),
            Bug("that averages each sentence's mean loss; average over all real positions together, as "
                "cross_entropy(ignore_index=pad_id) does", lambda lg, lb, e, p: _smoothed_by_hand(lg, lb, e, p,
                                                                                          per_row=True)),
            Bug("that is the sum over the real positions: average it (reduction='mean', the default)",
                lambda lg, lb, e, p: _smoothed_loss(lg, lb, e, p) * (lb != p).sum()),
            Bug("you ignore id 0 whatever pad_id is: ignore_index=pad_id",
                lambda lg, lb, e, p: _smoothed_loss(lg, lb, e, 0)),
            Bug("that is the KL divergence to the smoothed target (the Annotated Transformer's KLDivLoss): it is the "
                "cross-entropy minus the target's entropy, a constant; the exercise asks for the cross-entropy, as "
                "label_smoothing=eps computes", _smoothed_kl)]

    def as_tensor(got, expected):
        if isinstance(got, float) and not isinstance(got, bool):
            return torch.tensor(got, dtype=expected.dtype)
        return got

    return check("label_smoothed_loss", fn, _smoothed_loss, cases, bugs=bugs, adapt=as_tensor)
