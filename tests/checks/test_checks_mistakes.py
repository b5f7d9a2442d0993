"""Every exercise check against a table: a right answer written two ways passes, and each likely mistake
is rejected with its own message (the words listed with it), not with a generic "values differ".

The table also measures the share of generic rejections over all its wrong answers (at most 10%).
Lesson 10's checks have their own tests.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import checks
from helpers.attention import scaled_dot_product_attention
from helpers.masks import causal_mask

# check name: ([right answers, written two ways], [(wrong answer, words its line must contain), ...])
TABLE = {}

GENERIC = ("values differ from the reference", "entries differ from the reference", ", expected ",
           "shape (", "contains NaN where the reference has none")


def mistakes(name, rights, wrongs):
    TABLE[name] = (rights, wrongs)


# --- lesson 00 ------------------------------------------------------------------------------------

def _split(x, h):
    B, T, C = x.shape
    return x.view(B, T, h, C // h).transpose(1, 2)


mistakes("check_split_heads", [
    _split,
    lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1).permute(0, 2, 1, 3),
], [
    (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), "viewing straight to (B, H, T, D)"),
    (lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1), "the transpose is missing"),
    (lambda x, h: x.reshape(x.shape[0], x.shape[1], -1, h).transpose(1, 2), "H and D are swapped"),
    (lambda x, h: _split(x, h).transpose(-2, -1), "(B, H, D, T)"),
])

mistakes("check_merge_heads", [
    lambda x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1),
    lambda x: torch.cat(x.unbind(dim=1), dim=-1),
], [
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1), "the transpose is missing"),
    (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), "wrong order"),
    (lambda x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1).transpose(1, 2), "(B, T, H * D)"),
    (lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), "use reshape"),
])

mistakes("check_scores_shape", [
    lambda B, H, T, S: (B, H, T, S),
    lambda B, H, T, S: torch.Size([B, H, T, S]),
], [
    (lambda B, H, T, S: (B, H, S, T), "T and S are swapped"),
    (lambda B, H, T, S: (B, T, S), "the head axis is missing"),
    (lambda B, H, T, S: (B, T, H, S), "H comes second"),
    (lambda B, H, T, S: (B, H, T, T), "counts the keys"),
    (lambda B, H, T, S: torch.zeros(B, H, T, S), "not a tensor of that shape"),
])


# --- lesson 01 ------------------------------------------------------------------------------------

def _additive(s, h, W, U, b, v):
    return torch.tanh((s @ W.T)[:, None, :] + h @ U.T + b) @ v


def _additive_loop(s, h, W, U, b, v):
    return torch.stack([torch.tanh(s @ W.T + h[:, j] @ U.T + b) @ v for j in range(h.shape[1])], dim=1)


mistakes("check_additive_scores", [_additive, _additive_loop], [
    (lambda s, h, W, U, b, v: ((s @ W.T)[:, None, :] + h @ U.T + b) @ v, "the tanh is missing"),
    (lambda s, h, W, U, b, v: torch.tanh((s @ W)[:, None, :] + h @ U + b) @ v, "untransposed"),
    (lambda s, h, W, U, b, v: torch.tanh((s @ W.T)[:, None, :] + h @ U.T) @ v, "the bias b is missing"),
    (lambda s, h, W, U, b, v: torch.tanh((s @ W.T)[:, None, :] + h @ U.T + b).sum(-1), "product with v"),
    (lambda s, h, W, U, b, v: torch.softmax(_additive(s, h, W, U, b, v), -1), "those are the weights"),
])


def _read(s, h, m):
    w = torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1)
    return torch.einsum("bs,bse->be", w, h), w


def _read_by_hand(s, h, m):
    s = s.masked_fill(~m, float("-inf"))
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    w = e / e.sum(dim=-1, keepdim=True)
    return (w.unsqueeze(-1) * h).sum(dim=1), w


def _read_max_over_all(s, h, m):
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values) * m
    w = e / e.sum(dim=-1, keepdim=True)
    return (w.unsqueeze(-1) * h).sum(dim=1), w


mistakes("check_attention_read", [_read, _read_by_hand], [
    (lambda s, h, m: _read(s, h, torch.ones_like(m)), "padded positions still get weight"),
    (lambda s, h, m: _read(s, h, ~m), "polarity is flipped"),
    (_read_max_over_all, "row max also sees the padded scores"),
    (lambda s, h, m: _read(s.masked_fill(~m, 0.0), h, torch.ones_like(m)), "set to 0"),
    (lambda s, h, m: _read(s, h, m)[::-1], "swapped"),
])


def _norms(rnn, x):
    x = x.detach().clone().requires_grad_(True)
    out, _ = rnn(x[None])
    out[0, -1].sum().backward()
    return x.grad.norm(dim=-1)


def _norms_autograd(rnn, x):
    x = x.clone().requires_grad_()
    _, h_n = rnn(x.unsqueeze(0))
    (grad,) = torch.autograd.grad(h_n.sum(), x)
    return grad.pow(2).sum(-1).sqrt()


def _norms_on_callers_x(rnn, x):
    x.requires_grad_(True)
    rnn(x[None])[0][0, -1].sum().backward()
    return x.grad.norm(dim=-1)


def _grad(rnn, x, position=-1):
    x = x.detach().clone().requires_grad_(True)
    rnn(x[None])[0][0, position].sum().backward()
    return x.grad


mistakes("check_input_gradient_norms", [_norms, _norms_autograd], [
    (lambda rnn, x: (lambda x: (rnn(x[None])[0].sum().backward(), x.grad.norm(dim=-1))[1])(
        x.detach().clone().requires_grad_(True)), "yours sums every state"),
    (_norms_on_callers_x, "requires_grad on the caller's x"),
    (lambda rnn, x: _norms(rnn, x) ** 2, "squared norm"),
    (lambda rnn, x: _grad(rnn, x).norm(dim=0), "the norm runs over the positions"),
    (lambda rnn, x: _grad(rnn, x, 0).norm(dim=-1), "the first state"),
])


def _accuracy(w, n):
    hits = total = 0
    for b, L in enumerate(n.tolist()):
        hits += (w[b, :L].argmax(-1) == torch.arange(L - 1, -1, -1)).sum().item()
        total += L
    return hits / total


def _accuracy_vectorised(w, n):
    T = w.shape[1]
    i = torch.arange(T)
    real = i[None, :] < n[:, None]  # (B, T)
    target = n[:, None] - 1 - i[None, :]  # (B, T)
    return ((w.argmax(-1) == target) & real).sum() / real.sum()


def _accuracy_wrong_axis(w, n):
    hits = total = 0
    for b, L in enumerate(n.tolist()):
        hits += (w[b, :L, :L].argmax(0) == torch.arange(L - 1, -1, -1)).sum().item()
        total += L
    return hits / total


def _accuracy_padded_width(w, n):
    hits = total = 0
    S = w.shape[-1]
    for b, L in enumerate(n.tolist()):
        hits += (w[b, :L].argmax(-1) == torch.arange(S - 1, S - 1 - L, -1)).sum().item()
        total += L
    return hits / total


mistakes("check_alignment_accuracy", [_accuracy, _accuracy_vectorised], [
    (_accuracy_wrong_axis, "argmax runs over the outputs"),
    (_accuracy_padded_width, "not from the padded width"),
    (lambda w, n: sum(_accuracy(w[b:b + 1], n[b:b + 1]) for b in range(len(n))) / len(n), "mean of the sequences"),
    (lambda w, n: 100 * _accuracy(w, n), "percentage"),
    (lambda w, n: str(_accuracy(w, n)), "return a number"),
])


# --- lesson 02 and the core functions -------------------------------------------------------------

def _one_query_loop(q, k, v):
    scores = torch.stack([(q * k[j]).sum() for j in range(k.shape[0])]) / math.sqrt(q.shape[0])
    w = torch.exp(scores - scores.max())
    return sum(w[j] / w.sum() * v[j] for j in range(k.shape[0]))


mistakes("check_one_query", [
    lambda q, k, v: torch.softmax(k @ q / q.shape[0] ** 0.5, dim=0) @ v, _one_query_loop,
], [
    (lambda q, k, v: torch.softmax(k @ q, -1) @ v, "divide the scores by sqrt(D)"),
    (lambda q, k, v: v.mean(0), "plain mean of the values"),
    (lambda q, k, v: (k @ q / math.sqrt(q.shape[0])) @ v, "need a softmax"),
    (lambda q, k, v: torch.softmax(k @ q / math.sqrt(q.shape[0]), -1), "those are the weights"),
    (lambda q, k, v: torch.softmax(k @ q / q.shape[0], -1) @ v, "divided by D"),
])


def _self_attention(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v, weights


def _self_attention_einsum(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.einsum("...td,...sd->...ts", q, k).div(q.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("...ts,...sd->...td", weights, v), weights


def _transposed(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v, weights


mistakes("check_self_attention", [_self_attention, _self_attention_einsum], [
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_k, torch.eye(x.shape[-1])), "the values are x @ w_v"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q * math.sqrt(w_q.shape[-1] / x.shape[-1]), w_k, w_v),
     "divides by sqrt(C)"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q * math.sqrt(w_q.shape[-1]), w_k, w_v), "no 1/sqrt(D)"),
    (_transposed, "transposed (K Q^T)"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_k, w_v)[::-1], "swapped"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_q, w_v), "same matrix"),
])

mistakes("check_hard_lookup", [
    lambda q, k, v: v[(q @ k.T).argmax(dim=1)],
    lambda q, k, v: torch.stack([v[int(torch.argmax(k @ q_t))] for q_t in q]),
], [
    (lambda q, k, v: v[torch.cdist(q, k).argmin(dim=1)], "nearest key"),
    (lambda q, k, v: torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1) @ v, "soft attention"),
    (lambda q, k, v: (q @ k.T).argmax(dim=1), "indices of the best keys"),
    (lambda q, k, v: k[(q @ k.T).argmax(dim=1)], "the best key itself"),
    (lambda q, k, v: v[(q @ k.T).argmin(dim=1)], "argmin"),
])

mistakes("check_attention", [
    lambda q, k, v: scaled_dot_product_attention(q, k, v),
    lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -1) @ v,
], [
    (lambda q, k, v: torch.softmax(q @ k.mT, -1) @ v, "no 1/sqrt(D) scaling"),
    (lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -2) @ v, "over the queries"),
    (lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1], -1) @ v, "divided by D"),
    (lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -1), "returns the weights"),
])

mistakes("check_softmax", [
    lambda x: torch.softmax(x, dim=-1),
    lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True),
], [
    (lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), "subtract the row max"),
    (lambda x: torch.softmax(x, dim=0), "first dimension"),
    (lambda x: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(), "whole tensor"),
    (lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x).sum(-1, keepdim=True), "only in the numerator"),
])


# --- lesson 03 ------------------------------------------------------------------------------------

mistakes("check_log_softmax", [
    lambda x: torch.log_softmax(x, dim=-1),
    lambda x: x - x.amax(-1, keepdim=True) - (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True).log(),
], [
    (lambda x: torch.log(torch.softmax(x, dim=-1)), "underflows to 0"),
    (lambda x: x - torch.log(torch.exp(x).sum(dim=-1, keepdim=True)), "overflows"),
    (lambda x: x - torch.log(torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)), "not outside"),
    (lambda x: torch.log_softmax(x, dim=0), "first dimension"),
    (lambda x: torch.softmax(x, dim=-1), "not its log"),
])


def _softmax_backward_autograd(p, g):
    logits = torch.log(p.clamp_min(1e-30)).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.softmax(logits, -1), logits, g)
    return grad


mistakes("check_softmax_backward", [
    lambda p, g: p * (g - (p * g).sum(-1, keepdim=True)),
    lambda p, g: p * g - p * torch.einsum("...s,...s->...", p, g)[..., None],
], [
    (lambda p, g: p * g, "p * grad_p"),
    (lambda p, g: p * (g - g.mean(-1, keepdim=True)), "plain mean"),
    (lambda p, g: g - (p * g).sum(-1, keepdim=True), "lacks the factor p"),
    (lambda p, g: -(p * (g - (p * g).sum(-1, keepdim=True))), "opposite sign"),
    (lambda p, g: ((torch.diag_embed(p) - p[..., :, None] * p[..., None, :]) @ g[..., None])[..., 0], "Jacobian"),
])


def _tau_bisect(scores, target):
    lo, hi = 1e-4, 1e4
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        p = torch.softmax(scores / mid, -1)
        lo, hi = (mid, hi) if float(-(p * p.clamp_min(1e-300).log()).sum()) < target else (lo, mid)
    return math.sqrt(lo * hi)


def _tau_bits(scores, target):
    lo, hi = 1e-4, 1e4
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        p = torch.softmax(scores / mid, -1)
        lo, hi = (mid, hi) if float(-(p * p.clamp_min(1e-300).log2()).sum()) < target else (lo, mid)
    return math.sqrt(lo * hi)


mistakes("check_temperature_for_entropy", [
    _tau_bisect,
    lambda scores, target: torch.tensor(_tau_bisect(scores, target)),
], [
    (_tau_bits, "not bits"),
    (lambda scores, target: 1 / _tau_bisect(scores, target), "the other way round"),
    (lambda scores, target: -_tau_bisect(scores, target), "must be positive"),
    (lambda scores, target: "1.0", "as a number"),
])

# --- the table's tests ----------------------------------------------------------------------------

def _line(check, answer, capsys):
    capsys.readouterr()
    ok = check(answer)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    return bool(ok), lines[0]


@pytest.mark.parametrize("name", sorted(TABLE))
def test_right_answers_pass_and_each_mistake_is_named(name, capsys):
    check = getattr(checks, name)
    rights, wrongs = TABLE[name]
    assert len(rights) >= 2 and len(wrongs) >= 2
    for right in rights:
        ok, line = _line(check, right, capsys)
        assert ok and line.startswith("✓"), line
    for wrong, words in wrongs:
        ok, line = _line(check, wrong, capsys)
        assert not ok and line.startswith("✗"), line
        assert words in line, f"expected {words!r} in: {line}"
