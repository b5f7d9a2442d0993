"""Every exercise check against a table: a right answer written two ways passes, and each likely mistake
is rejected with its own message (the words listed with it), not with a generic "values differ".

The table also measures the share of generic rejections over all its wrong answers (at most 10%).
Lesson 10's checks have their own tests (tests/checks/test_checks_lesson10.py); lessons 12 and 13's are here too.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from test_checks_lesson11 import wordpiece as _wordpiece  # the same folder: a right answer written out
from test_checks_lesson12 import bits_per_char_of as _bpc
from test_checks_lesson12 import cached_step as _cached_step
from test_checks_lesson12 import no_norm as _no_norm
from test_checks_lesson12 import no_offset as _no_offset
from test_checks_lesson13 import ablation_table as _table13
from test_checks_lesson13 import induction_score as _ind_score13
from test_checks_lesson13 import previous_token_score as _prev_score13
from test_checks_lesson13 import zero_head_hook as _zero_hook13

from helpers import checks
from helpers.attention import scaled_dot_product_attention
from helpers.masks import causal_mask
from helpers.positional import apply_rotary

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
    (lambda x, h: x.reshape(x.shape[0], x.shape[1], -1, h).permute(0, 3, 1, 2), "every H-th feature"),
    (lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).transpose(0, 2), "transpose(0, 2) moves the batch axis"),
    (lambda x, h: _split(x, h).double(), "a .double()"),
])

mistakes("check_merge_heads", [
    lambda x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1),
    lambda x: torch.cat(x.unbind(dim=1), dim=-1),
], [
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1), "the transpose is missing"),
    (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), "wrong order"),
    (lambda x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1).transpose(1, 2), "(B, T, H * D)"),
    (lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), "use reshape"),
    (lambda x: x.transpose(1, 2).reshape(x.shape[0], -1), "the token axis is gone"),
    (lambda x: x.transpose(1, 2), "transpose(1, 2) alone"),
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
    (lambda B, H, T, S: (B * H, T, S), "merged into one"),
    (lambda B, H, T, S: (H, T, S), "the batch axis is missing"),
    (lambda B, H, T, S: B * H * T * S, "the number of scores"),
    (lambda B, H, T, S: f"({B}, {H}, {T}, {S})", "not a string"),
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
    (lambda s, h, W, U, b, v: (torch.tanh((s @ W.T)[:, None, :] + h @ U.T) + b) @ v, "added after the tanh"),
    (lambda s, h, W, U, b, v: torch.tanh(h @ U.T + b) @ v, "the query term W s is missing"),
    (lambda s, h, W, U, b, v: torch.tanh((s @ W.T + b)[:, None, :].expand(-1, h.shape[1], -1)) @ v,
     "the state term U h_j is missing"),
    (lambda s, h, W, U, b, v: torch.relu((s @ W.T)[:, None, :] + h @ U.T + b) @ v, "not ReLU"),
    (lambda s, h, W, U, b, v: torch.sigmoid((s @ W.T)[:, None, :] + h @ U.T + b) @ v, "not the sigmoid"),
    (lambda s, h, W, U, b, v: _additive(s, h, W, U, b, v) / len(v) ** 0.5, "no 1/sqrt(A) factor"),
    (lambda s, h, W, U, b, v: -_additive(s, h, W, U, b, v), "opposite sign"),
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


def _read_weights(h, w):
    return (w.unsqueeze(-1) * h).sum(dim=1), w


mistakes("check_attention_read", [_read, _read_by_hand], [
    (lambda s, h, m: _read(s, h, torch.ones_like(m)), "padded positions still get weight"),
    (lambda s, h, m: _read(s, h, ~m), "polarity is flipped"),
    (_read_max_over_all, "row max also sees the padded scores"),
    (lambda s, h, m: _read(s.masked_fill(~m, 0.0), h, torch.ones_like(m)), "set to 0"),
    (lambda s, h, m: _read(s, h, m)[::-1], "swapped"),
    (lambda s, h, m: _read_weights(h, torch.softmax(s.masked_fill(~m, float("-inf")), dim=0)), "over the batch"),
    (lambda s, h, m: _read_weights(h, torch.softmax(s, dim=-1) * m), "no longer sum to 1"),
    (lambda s, h, m: _read_weights(h, torch.exp(s) * m / (torch.exp(s) * m).sum(-1, keepdim=True)), "exp overflows"),
    (lambda s, h, m: _read(s, h, m)[0], "the context alone"),
    (lambda s, h, m: (h.sum(dim=1), _read(s, h, m)[1]), "without the weights"),
    (lambda s, h, m: ((_read(s, h, m)[1][..., None] * h).mean(dim=1), _read(s, h, m)[1]), "divides by S"),
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
    (lambda rnn, x: _grad(rnn, x).abs().sum(-1), "L1 norm"),
    (lambda rnn, x: _grad(rnn, x).sum(-1), "sum of the gradient's entries"),
    (lambda rnn, x: _grad(rnn, x), "the whole gradient (L, C)"),
    (lambda rnn, x: _norms(rnn, x).flip(0), "reverse order"),
    (lambda rnn, x: _norms(rnn, x) / _norms(rnn, x)[-1], "divided by the last one"),
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


def _accuracy_target(w, n, target, all_rows=False):
    hits = total = 0
    for b, L in enumerate(n.tolist()):
        rows = w.shape[1] if all_rows else L
        hits += (w[b, :rows].argmax(-1) == torch.tensor([target(L, i) for i in range(rows)])).sum().item()
        total += rows
    return hits / total


mistakes("check_alignment_accuracy", [_accuracy, _accuracy_vectorised], [
    (_accuracy_wrong_axis, "argmax runs over the outputs"),
    (_accuracy_padded_width, "not from the padded width"),
    (lambda w, n: sum(_accuracy(w[b:b + 1], n[b:b + 1]) for b in range(len(n))) / len(n), "mean of the sequences"),
    (lambda w, n: 100 * _accuracy(w, n), "percentage"),
    (lambda w, n: str(_accuracy(w, n)), "return a number"),
    (lambda w, n: _accuracy_target(w, n, lambda L, i: i), "the diagonal"),
    (lambda w, n: _accuracy_target(w, n, lambda L, i: L - i), "off by one"),
    (lambda w, n: _accuracy_target(w, n, lambda L, i: L - 1 - i, all_rows=True), "padded outputs"),
    (lambda w, n: round(_accuracy(w, n) * int(n.sum())), "the number of hits"),
    (lambda w, n: 1 - _accuracy(w, n), "fraction of misses"),
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
    (lambda q, k, v: torch.softmax(k @ q / k.shape[0] ** 0.5, -1) @ v, "sqrt(S)"),
    (lambda q, k, v: torch.softmax(k @ q * q.shape[0] ** 0.5, -1) @ v, "multiplied by sqrt(D)"),
    (lambda q, k, v: v.sum(0), "plain sum of the values"),
    (lambda q, k, v: v[(k @ q).argmax()], "a hard lookup"),
    (lambda q, k, v: torch.softmax(-(k @ q) / q.shape[0] ** 0.5, -1) @ v, "wrong sign"),
    (lambda q, k, v: (torch.softmax(k @ q / q.shape[0] ** 0.5, -1) @ v)[None], "an extra axis of size 1"),
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


def _self_attention_softmax_dim(x, w_q, w_k, w_v, dim):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=dim)
    return weights @ v, weights


mistakes("check_self_attention", [_self_attention, _self_attention_einsum], [
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_k, torch.eye(x.shape[-1])), "the values are x @ w_v"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q * math.sqrt(w_q.shape[-1] / x.shape[-1]), w_k, w_v),
     "divides by sqrt(C)"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q * math.sqrt(w_q.shape[-1]), w_k, w_v), "no 1/sqrt(D)"),
    (_transposed, "transposed (K Q^T)"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_k, w_v)[::-1], "swapped"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_q, w_v), "same matrix"),
    (lambda x, w_q, w_k, w_v: _self_attention_softmax_dim(x, w_q, w_k, w_v, 0), "dim 0"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q * w_q.shape[-1] ** -0.5, w_k, w_v), "divided by D"),
    (lambda x, w_q, w_k, w_v: _self_attention(x, w_q, w_k, w_v)[0], "the output alone"),
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
    (lambda q, k, v: torch.softmax(50 * q @ k.T, -1) @ v, "not exactly it"),
    (lambda q, k, v: torch.softmax(1000 * q @ k.T, -1) @ v, "not exactly it"),
    (lambda q, k, v: torch.softmax(q @ k.T, -1) @ v, "without the 1/sqrt(D) scaling"),
    (lambda q, k, v: F.one_hot((q @ k.T).argmax(1), k.shape[0]).float(), "one-hot weights"),
    (lambda q, k, v: v[(F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).T).argmax(1)], "cosine similarity"),
    (lambda q, k, v: v[(q @ k.T).abs().argmax(1)], "largest |score|"),
    (lambda q, k, v: v[(q @ k.T).argmax(1, keepdim=True)], "an extra axis of size 1"),
])

mistakes("check_attention", [
    lambda q, k, v: scaled_dot_product_attention(q, k, v),
    lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -1) @ v,
], [
    (lambda q, k, v: torch.softmax(q @ k.mT, -1) @ v, "no 1/sqrt(D) scaling"),
    (lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -2) @ v, "over the queries"),
    (lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1], -1) @ v, "divided by D"),
    (lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -1), "returns the weights"),
    (lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, 0) @ v, "dim 0"),
    (lambda q, k, v: torch.softmax(q @ k.mT / k.shape[-2] ** 0.5, -1) @ v, "sqrt(S)"),
    (lambda q, k, v: torch.softmax(q @ k.mT * q.shape[-1] ** 0.5, -1) @ v, "multiplied by sqrt(D)"),
    (lambda q, k, v: torch.softmax(k @ q.mT / q.shape[-1] ** 0.5, -1) @ v, "transposed (K Q^T)"),
    (lambda q, k, v: torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -1) @ k, "multiply the keys"),
    (lambda q, k, v: (torch.softmax(q @ k.mT / q.shape[-1] ** 0.5, -1) @ v).double(), "a .double()"),
])

mistakes("check_softmax", [
    lambda x: torch.softmax(x, dim=-1),
    lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True),
], [
    (lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), "subtract the row max"),
    (lambda x: torch.softmax(x, dim=0), "first dimension"),
    (lambda x: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(), "whole tensor"),
    (lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x).sum(-1, keepdim=True), "only in the numerator"),
    (lambda x: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(-1, keepdim=True), "row's own max"),
    (lambda x: torch.log_softmax(x, -1), "that is log_softmax"),
    (lambda x: x / x.sum(-1, keepdim=True), "the exp is missing"),
    (lambda x: torch.exp(x - x.amax(-1, keepdim=True)), "division by the row sum is missing"),
    (lambda x: torch.softmax(-x, -1), "of -x"),
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
    (lambda x: torch.log_softmax(x, -1) / math.log(2), "log base 2"),
    (lambda x: x - x.amax(-1, keepdim=True) - (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True).log10(),
     "log base 10"),
    (lambda x: x - x.max() - (x - x.max()).exp().sum(-1, keepdim=True).log(), "max of the whole tensor"),
    (lambda x: x - x.amax(-1, keepdim=True) + (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True).log(),
     "is added"),
    (lambda x: x - x.amax(-1, keepdim=True), "is missing"),
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
    (lambda p, g: g * (p - p ** 2), "only the diagonal"),
    (lambda p, g: p * g - p * (p * g), "a sum over the row"),  # the same as the diagonal alone
    (lambda p, g: p * (g - (p * g).sum()), "over the whole tensor"),
    (lambda p, g: p * (g - (p * g).sum(0, keepdim=True)), "over the first dimension"),
    (lambda p, g: p * g - (p * g).sum(-1, keepdim=True), "lacks its factor p"),
])


def _tau_bisect(scores, target, log=torch.log):
    lo, hi = 1e-4, 1e4
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        p = torch.softmax(scores / mid, -1)
        lo, hi = (mid, hi) if float(-(p * log(p.clamp_min(1e-300))).sum()) < target else (lo, mid)
    return math.sqrt(lo * hi)


mistakes("check_temperature_for_entropy", [
    _tau_bisect,
    lambda scores, target: torch.tensor(_tau_bisect(scores, target)),
], [
    (lambda scores, target: _tau_bisect(scores, target, log=torch.log2), "not bits"),
    (lambda scores, target: 1 / _tau_bisect(scores, target), "the other way round"),
    (lambda scores, target: -_tau_bisect(scores, target), "must be positive"),
    (lambda scores, target: "1.0", "as a number"),
    (lambda scores, target: math.log(_tau_bisect(scores, target)), "that is log tau"),
])

# --- lesson 04 ------------------------------------------------------------------------------------

mistakes("check_mha_param_count", [
    lambda d, h, b=True: 4 * d * d + (4 * d if b else 0),
    lambda d, h, b=True: 4 * (d * d + d * b),
], [
    (lambda d, h, b=True: 4 * d * d + 4 * d, "although bias=False"),
    (lambda d, h, b=True: 4 * d * d, "the biases are missing"),
    (lambda d, h, b=True: h * (4 * d * d + (4 * d if b else 0)), "depends on n_heads"),
    (lambda d, h, b=True: 3 * d * d + (3 * d if b else 0), "output projection is missing"),
    (lambda d, h, b=True: sum(p.numel() for p in torch.nn.Linear(d, 4 * d, bias=b).parameters()), "calls torch"),
])


def _split_qkv(x, w, b, h):
    B, T, C = x.shape
    return tuple(t.view(B, T, h, C // h).transpose(1, 2) for t in F.linear(x, w, b).split(C, dim=-1))


def _split_qkv_each(x, w, b, h):
    B, T, C = x.shape
    out = []
    for i in range(3):
        t = x @ w[i * C:(i + 1) * C].T + b[i * C:(i + 1) * C]  # (B, T, C)
        out.append(t.reshape(B, T, h, -1).permute(0, 2, 1, 3))
    return out


def _split_heads_first(x, w, b, h):
    B, T, C = x.shape
    return F.linear(x, w, b).view(B, T, h, 3 * C // h).transpose(1, 2).chunk(3, dim=-1)


mistakes("check_split_qkv", [_split_qkv, _split_qkv_each], [
    (lambda x, w, b, h: tuple(t.reshape(x.shape[0], h, x.shape[1], -1) for t in F.linear(x, w, b).split(
        x.shape[-1], dim=-1)), "mixes tokens"),
    (lambda x, w, b, h: _split_qkv(x, w, None, h), "the bias is missing"),
    (_split_heads_first, "split the heads before cutting q, k, v"),
])


def _gqa(q, k, v):
    r = q.shape[1] // k.shape[1]
    return scaled_dot_product_attention(q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1))[0]


def _gqa_grouped(q, k, v):
    B, H, T, D = q.shape
    G = k.shape[1]
    qg = q.view(B, G, H // G, T, D)  # (B, G, H/G, T, D)
    w = torch.softmax(qg @ k[:, :, None].transpose(-2, -1) / D ** 0.5, -1)  # (B, G, H/G, T, S)
    return (w @ v[:, :, None]).reshape(B, H, T, D)


mistakes("check_grouped_query_attention", [_gqa, _gqa_grouped], [
    (lambda q, k, v: scaled_dot_product_attention(q, k.repeat(1, q.shape[1] // k.shape[1], 1, 1),
                                                  v.repeat(1, q.shape[1] // k.shape[1], 1, 1))[0], "h % G"),
    (lambda q, k, v: scaled_dot_product_attention(q, k[:, :1], v[:, :1])[0], "uses key/value group 0"),
    (lambda q, k, v: scaled_dot_product_attention(q, k.mean(1, keepdim=True), v.mean(1, keepdim=True))[0],
     "averaged into one"),
    (lambda q, k, v: torch.softmax(q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).mT, -1)
     @ v.repeat_interleave(q.shape[1] // k.shape[1], 1), "not scaled"),
])


def _mass(w, p):
    rows = p.any(-1)
    return (w * p).sum(-1)[..., rows].mean(dim=(0, 2))


def _mass_loop(w, p):
    B, H, T, S = w.shape
    rows = [t for t in range(T) if p[t].any()]
    return torch.stack([torch.stack([w[b, h, t][p[t]].sum() for b in range(B) for t in rows]).mean()
                        for h in range(H)])


mistakes("check_pattern_mass", [_mass, _mass_loop], [
    (lambda w, p: (w * p).sum(-1).mean(dim=(0, 2)), "not counted as 0"),
    (lambda w, p: (w * p).sum(-1)[..., p.any(-1)].mean(dim=(1, 2)), "the mean runs over the heads"),
    (lambda w, p: (w * p).sum(-1)[..., p.any(-1)].sum(dim=(0, 2)), "that is a sum"),
    (lambda w, p: (w * p).mean(-1)[..., p.any(-1)].mean(dim=(0, 2)), "averaged over the keys"),
])


# --- lesson 05 ------------------------------------------------------------------------------------

mistakes("check_causal_mask", [
    lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T),
    lambda T, S: torch.arange(S)[None, :] <= torch.arange(S - T, S)[:, None],
], [
    (lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(), "aligned top-left"),
    (lambda T, S: ~torch.ones(T, S, dtype=torch.bool).tril(S - T), "polarity flipped"),
    (lambda T, S: torch.ones(T, S, dtype=torch.bool).triu(S - T), "see the future"),
    (lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T - 1), "diagonal is missing"),
])

mistakes("check_padding_mask", [
    lambda ids, pad_id: (ids != pad_id)[:, None, None, :],
    lambda ids, pad_id: ids.ne(pad_id).view(ids.shape[0], 1, 1, ids.shape[1]),
], [
    (lambda ids, pad_id: (ids == pad_id)[:, None, None, :], "polarity flipped"),
    (lambda ids, pad_id: ids != pad_id, "shape (B, S)"),
    (lambda ids, pad_id: (ids != pad_id)[:, None, :, None], "masks queries"),
    (lambda ids, pad_id: (ids != 0)[:, None, None, :], "whatever pad_id is"),
    (lambda ids, pad_id: (torch.cumsum(ids == pad_id, -1) == 0)[:, None, None, :], "from the first pad"),
])


def _way2(q, k, v, mask, max_over_allowed=True, guard=True, renormalise=True, scale=None):
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    mask = mask.expand_as(scores)
    top = torch.where(mask, scores, torch.finfo(scores.dtype).min) if max_over_allowed else scores
    e = torch.where(mask, torch.exp(scores - top.amax(-1, keepdim=True)), 0.0)
    if not renormalise:
        w = torch.softmax(scores, -1) * mask
    else:
        w = e / (e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny) if guard else e.sum(-1, keepdim=True))
    return w @ v, w


def _way2_times_mask(q, k, v, mask):  # every exp, then * mask: a blocked exp of inf gives inf * 0 = NaN
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    mask = mask.expand_as(scores)
    e = torch.exp(scores - scores.masked_fill(~mask, float("-inf")).amax(-1, keepdim=True)) * mask
    w = e / e.sum(-1, keepdim=True).clamp_min(1e-30)
    return w @ v, w


def _way2_where(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    mask = mask.expand_as(scores)
    top = torch.where(mask, scores, torch.finfo(scores.dtype).min).amax(-1, keepdim=True)
    e = torch.where(mask, torch.exp(scores - top), torch.zeros_like(scores))
    total = e.sum(-1, keepdim=True)
    w = torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)
    return w @ v, w


mistakes("check_masked_attention", [_way2, _way2_where], [
    (lambda q, k, v, m: _way2(q, k, v, ~m), "polarity flipped"),
    (lambda q, k, v, m: _way2(q, k, v, m, guard=False), "0 / 0 = NaN"),
    (lambda q, k, v, m: _way2(q, k, v, m, max_over_allowed=False, guard=False), "two traps"),
    (lambda q, k, v, m: _way2(q, k, v, m, max_over_allowed=False), "your max includes the blocked scores"),
    (lambda q, k, v, m: _way2(q, k, v, m, renormalise=False), "not renormalised"),
    (lambda q, k, v, m: scaled_dot_product_attention(q, k, v, m), "passes -inf"),
    (_way2_times_mask, "inf * 0 = NaN"),
    (lambda q, k, v, m: _way2(q, k, v, m, scale=1.0), "not scaled"),
])

mistakes("check_mha_masks", [
    lambda c, p: (~c, ~p[:, 0, 0, :]),
    lambda c, p: (c.logical_not(), p.flatten(1).logical_not()),
], [
    (lambda c, p: (c, p[:, 0, 0, :]), "still have the course's polarity"),
    (lambda c, p: (~c, p[:, 0, 0, :]), "attn_mask is right"),
    (lambda c, p: (c, ~p[:, 0, 0, :]), "key_padding_mask is right"),
    (lambda c, p: (~c, ~p.squeeze()), "squeeze() also drops the batch axis"),
    (lambda c, p: (~c, ~p), "key_padding_mask must be (B, S)"),
    (lambda c, p: (~p[:, 0, 0, :], ~c), "swapped"),
])


def _leaks(f, x):
    base = f(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn_like(changed[:, t + 1:])
        if not torch.allclose(f(changed)[:, :t + 1], base[:, :t + 1], atol=1e-6):
            return True
    return False


def _leaks_jacobian(f, x):
    jac = torch.autograd.functional.jacobian(lambda z: f(z[None])[0], x[0])  # (T, C, T, C)
    influence = jac.abs().sum(dim=(1, 3))  # (T out, T in)
    return bool((influence.triu(1) > 1e-9).any())


def _leaks_until(last_t):
    def detector(f, x):
        base = f(x)
        for t in range(last_t(x.shape[1])):
            changed = x.clone()
            changed[:, t + 1:] = changed[:, t + 1:] + 1.0
            if not torch.allclose(f(changed)[:, :t + 1], base[:, :t + 1], atol=1e-6):
                return True
        return False
    return detector


def _leaks_position_0(f, x):
    changed = x.clone()
    changed[:, 1:] = changed[:, 1:] + 1.0
    return not torch.allclose(f(changed)[:, 0], f(x)[:, 0], atol=1e-6)


def _leaks_last_input(f, x):
    changed = x.clone()
    changed[:, -1] = changed[:, -1] + 1.0
    return not torch.allclose(f(changed)[:, :-1], f(x)[:, :-1], atol=1e-6)


mistakes("check_leaks_future", [_leaks, _leaks_jacobian], [
    (_leaks_until(lambda T: T - 2), "never tests t = T - 2"),
    (_leaks_position_0, "compares only output 0"),
    (_leaks_last_input, "before the last one"),
    (lambda f, x: torch.tensor(1.0) if _leaks(f, x) else torch.tensor(0.0), "return True or False"),
])


# --- lesson 06 ------------------------------------------------------------------------------------

def _omega(d):
    return 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _shift(k, d):
    m = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(_omega(d).tolist()):
        c, s = math.cos(k * w), math.sin(k * w)
        m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return m


def _shift_block_diag(k, d):
    c, s = torch.cos(k * _omega(d)), torch.sin(k * _omega(d))
    blocks = [torch.stack([torch.stack([ci, si]), torch.stack([-si, ci])]) for ci, si in zip(c, s, strict=True)]
    return torch.block_diag(*blocks)  # one 2 x 2 rotation per frequency


mistakes("check_shift_matrix", [_shift, lambda k, d: _shift_block_diag(k, d).float()], [
    (lambda k, d: _shift(k, d).T, "the transpose"),
    (lambda k, d: checks.lesson06._shift_matrix_with(k, d, 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d)),
     "10000^(-i/d_model)"),
    (checks.lesson06._half_split_shift, "(i, i + d_model/2)"),
])


def _distance(n, d):
    pos = torch.arange(n, dtype=torch.float64)
    return torch.cos((pos[:, None, None] - pos[None, :, None]) * _omega(d)).sum(-1)


def _distance_loop(n, d):
    out = torch.zeros(n, n)
    for p in range(n):
        for q in range(n):
            out[p, q] = sum(math.cos((p - q) * w) for w in _omega(d).tolist())
    return out


mistakes("check_distance_scores", [_distance, _distance_loop], [
    (lambda n, d: torch.cos((torch.arange(n)[:, None, None] - torch.arange(n)[None, :, None]).double()
                            * 10000.0 ** (-torch.arange(d, dtype=torch.float64) / d)).sum(-1), "d_model cosines"),
    (lambda n, d: 2 * _distance(n, d), "twice the reference"),
    (lambda n, d: torch.sin((torch.arange(n)[:, None, None] - torch.arange(n)[None, :, None]).double()
                            * _omega(d)).sum(-1), "summed sines"),
    (lambda n, d: (lambda pe: pe @ pe.T)(checks.lesson06.sinusoidal_encoding(n, d)), "computes sines"),
    (lambda n, d: torch.cos((torch.arange(n)[:, None, None] + torch.arange(n)[None, :, None]).double()
                            * _omega(d)).sum(-1), "cos((p + q) w_i)"),
    (lambda n, d: torch.cos((torch.arange(n)[:, None, None] - torch.arange(n)[None, :, None]).double()
                            * _omega(d)).mean(-1), "the mean over the pairs"),
])


def _rotate_half(x):
    T, D = x.shape[-2:]
    angle = torch.arange(T, dtype=torch.float64)[:, None] * _omega(D)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


def _rotate_half_complex(x):
    T, D = x.shape[-2:]
    z = torch.complex(x[..., :D // 2].double(), x[..., D // 2:].double())
    z = z * torch.polar(torch.ones(T, D // 2, dtype=torch.float64),
                        torch.arange(T, dtype=torch.float64)[:, None] * _omega(D))
    return torch.cat((z.real, z.imag), -1).to(x.dtype)


mistakes("check_rotate_half", [_rotate_half, _rotate_half_complex], [
    (checks.lesson06.apply_rotary, "interleaved layout"),
    (lambda x: checks.lesson06._rotate_half(x, sign=-1.0), "wrong way"),
    (lambda x: checks.lesson06._rotate_half(x, exponent=1), "10000^(-i/D)"),
])

mistakes("check_alibi_bias", [
    lambda T, s: -s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float(),
    lambda T, s: -s * torch.cdist(torch.arange(T).float()[:, None], torch.arange(T).float()[:, None]),
], [
    (lambda T, s: s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float(), "sign is flipped"),
    (lambda T, s: -s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float(), "without abs()"),
    (lambda T, s: (-s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float()).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), "causal mask"),
    (lambda T, s: -(torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float(), "slope is missing"),
])

# --- lesson 07 ------------------------------------------------------------------------------------

mistakes("check_rms_norm", [
    lambda x, g, eps=1e-6: g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps),
    lambda x, g, eps=1e-6: g * x * torch.rsqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps),
], [
    (lambda x, g, eps=1e-6: g * (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        x.var(-1, keepdim=True, unbiased=False) + eps), "that is LayerNorm"),
    (lambda x, g, eps=1e-6: g * x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps), "the wrong axis"),
    (lambda x, g, eps=1e-6: g * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps), "inside the square root"),
    (lambda x, g, eps=1e-6: g * x / x.norm(dim=-1, keepdim=True), "the L2 norm"),
    (lambda x, g, eps=1e-6: g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True)), "eps is missing"),
    (lambda x, g, eps=1e-6: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps), "the gain is missing"),
])


def _ffn(x, w1, b1, w2, b2):
    return F.gelu(x @ w1.T + b1) @ w2.T + b2


mistakes("check_feed_forward_gelu", [
    _ffn,
    lambda x, w1, b1, w2, b2: F.linear(torch.nn.GELU()(F.linear(x, w1, b1)), w2, b2),
], [
    (lambda x, w1, b1, w2, b2: F.relu(x @ w1.T + b1) @ w2.T + b2, "ReLU"),
    (lambda x, w1, b1, w2, b2: (x @ w1.T + b1) @ w2.T + b2, "the activation is missing"),
    (lambda x, w1, b1, w2, b2: F.gelu((x @ w1.T + b1) @ w2.T + b2), "after the second layer"),
    (lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T + b1, approximate="tanh") @ w2.T + b2, "tanh approximation"),
])

mistakes("check_deepnorm_sublayer", [
    lambda x, s, n, a: n(a * x + s(x)),
    lambda x, s, n, a: n(torch.add(s(x), x, alpha=a)),
], [
    (lambda x, s, n, a: n(x + a * s(x)), "alpha scales the sub-layer"),
    (lambda x, s, n, a: n(x + s(x)), "alpha is ignored"),
    (lambda x, s, n, a: a * x + s(n(x)), "Pre-LN style"),
])


def _rope(x, mha):
    B, T, C = x.shape
    H, D = mha.n_heads, C // mha.n_heads
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (mha.w_q(x), mha.w_k(x), mha.w_v(x)))
    out = scaled_dot_product_attention(apply_rotary(q), apply_rotary(k), v)[0]
    return mha.w_o(out.transpose(1, 2).reshape(B, T, C))


def _rope_complex(x, mha):
    B, T, C = x.shape
    H, D = mha.n_heads, C // mha.n_heads
    angle = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, D, 2) / D)  # (T, D/2)
    turn = torch.polar(torch.ones_like(angle), angle)  # (T, D/2)

    def rope(t):  # (B, H, T, D) with pairs (2i, 2i + 1) as complex numbers
        z = torch.view_as_complex(t.double().reshape(B, H, T, D // 2, 2).contiguous())
        return torch.view_as_real(z * turn).reshape(B, H, T, D).float()

    q, k, v = (t.reshape(B, T, H, D).permute(0, 2, 1, 3) for t in (mha.w_q(x), mha.w_k(x), mha.w_v(x)))
    w = torch.softmax(rope(q) @ rope(k).mT / D ** 0.5, -1)
    return mha.w_o((w @ v).permute(0, 2, 1, 3).reshape(B, T, C)), w


def _rope_with(rotate=(True, True, False), before_split=False, project_out=True):
    return lambda x, mha: checks.lesson07._rope_attention(x, mha, rotate, before_split, project_out)


mistakes("check_rope_attention", [_rope, _rope_complex], [
    (lambda x, mha: mha(x, x, x)[0], "no rotation at all"),
    (_rope_with(rotate=(True, True, True)), "rotated the values too"),
    (_rope_with(rotate=(True, False, False)), "only the queries"),
    (_rope_with(rotate=(False, True, False)), "only the keys"),
    (_rope_with(before_split=True), "before splitting the heads"),
    (_rope_with(project_out=False), "output projection is missing"),
    (checks.lesson07._half_split_rope, "pairs feature i with i + D/2"),
    (lambda x, mha: checks.lesson07._rope_attention(x, mha, scale=1.0), "not scaled"),
    (lambda x, mha: checks.lesson07._rope_attention(x, mha, scale=x.shape[-1] ** -0.5), "not by sqrt(C)"),
    (lambda x, mha: checks.lesson07._rope_attention(x, mha, merge_transpose=False), "mixes tokens"),
])


def _swiglu(x, wg, wu, wd):
    return (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T


mistakes("check_swiglu", [
    _swiglu,
    lambda x, wg, wu, wd: F.linear(F.linear(x, wg) * torch.sigmoid(F.linear(x, wg)) * F.linear(x, wu), wd),
], [
    (lambda x, wg, wu, wd: (torch.sigmoid(x @ wg.T) * (x @ wu.T)) @ wd.T, "sigmoid"),
    (lambda x, wg, wu, wd: (F.silu(x @ wu.T) * (x @ wg.T)) @ wd.T, "applied to the up branch"),
    (lambda x, wg, wu, wd: (F.gelu(x @ wg.T) * (x @ wu.T)) @ wd.T, "GELU"),
    (lambda x, wg, wu, wd: ((x @ wg.T) * (x @ wu.T)) @ wd.T, "activation is missing"),
    (lambda x, wg, wu, wd: F.silu(x @ wg.T) @ wd.T, "the up branch is missing"),
    (lambda x, wg, wu, wd: F.silu((x @ wg.T) * (x @ wu.T)) @ wd.T, "after the product"),
])


# --- lesson 08 ------------------------------------------------------------------------------------

mistakes("check_teacher_forcing", [
    lambda t: (t[:, :-1], t[:, 1:]),
    lambda t: (t.narrow(1, 0, t.shape[1] - 1), t.narrow(1, 1, t.shape[1] - 1)),
], [
    (lambda t: (t[:, 1:], t[:, :-1]), "the two are swapped"),
    (lambda t: (t, t[:, 1:]), "must have T tokens"),
    (lambda t: (t[:, :-1], t[:, :-1]), "the labels are not shifted"),
    (lambda t: (t[:, 1:], t[:, 1:]), "keeps </s> and drops <s>"),
])


def _self_mask(t, p):
    return causal_mask(t.shape[1]) & (t != p)[:, None, None, :]


def _self_mask_loop(t, p):
    B, T = t.shape
    m = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(i + 1):
                m[b, 0, i, j] = bool(t[b, j] != p)
    return m


def _tri(t, p, tri):
    return tri(torch.ones(t.shape[1], t.shape[1], dtype=torch.bool)) & (t != p)[:, None, None, :]


mistakes("check_decoder_self_mask", [_self_mask, _self_mask_loop], [
    (lambda t, p: causal_mask(t.shape[1]).expand(t.shape[0], 1, -1, -1), "the padding is missing"),
    (lambda t, p: (t != p)[:, None, None, :].expand(-1, 1, t.shape[1], -1), "the causal part is missing"),
    (lambda t, p: ~_self_mask(t, p), "polarity flipped"),
    (lambda t, p: causal_mask(t.shape[1]) & (t != p)[:, None, :, None], "you hid the pads as queries"),
    (lambda t, p: _tri(t, p, torch.triu), "triu keeps the upper triangle"),
    (lambda t, p: _tri(t, p, lambda m: m.tril(-1)), "tril(-1) drops the diagonal"),
    (lambda t, p: _self_mask(t, p)[:, 0], "add the head axis"),
])


def _greedy(lg, ys, f, e, p):
    best = torch.where(f, torch.full_like(ys[:, 0], p), lg.argmax(-1))
    return torch.cat((ys, best[:, None]), 1), f | (best == e)


def _greedy_in_place(lg, ys, f, e, p):
    best = lg.argmax(dim=1)
    best[f] = p
    return torch.hstack([ys, best.unsqueeze(1)]), torch.logical_or(f, best.eq(e))


mistakes("check_greedy_step", [_greedy, _greedy_in_place], [
    (lambda lg, ys, f, e, p: (torch.cat((ys, lg.argmax(-1)[:, None]), 1), f | (lg.argmax(-1) == e)),
     "must only grow pad_id"),
    (lambda lg, ys, f, e, p: (_greedy(lg, ys, f, e, p)[0], _greedy(lg, ys, f, e, p)[0][:, -1] == e),
     "must stay True once set"),
    (lambda lg, ys, f, e, p: (_greedy(lg, ys, f, e, p)[0], f), "returned unchanged"),
    (lambda lg, ys, f, e, p: (torch.cat((_greedy(lg, ys, f, e, p)[0][:, -1:], ys), 1),
                              _greedy(lg, ys, f, e, p)[1]), "not in front"),
    (lambda lg, ys, f, e, p: _greedy(lg, ys, f, e, p)[::-1], "in that order"),
])

mistakes("check_length_normalised_score", [
    lambda lp, n, a: lp / ((5 + n) / 6) ** a,
    lambda lp, n, a: lp * (6 / (5 + n)) ** a,
], [
    (lambda lp, n, a: lp / n ** a, "divides by length ** alpha"),
    (lambda lp, n, a: lp * ((5 + n) / 6) ** a, "the penalty multiplies"),
    (lambda lp, n, a: lp / (5 + n) / 6 ** a, "precedence"),
    (lambda lp, n, a: lp / ((5 + n) / 6 ** a), "precedence"),
    (lambda lp, n, a: lp / ((1 + n) / 6) ** a, "not 1 + length"),
])


def _smoothed(lg, lb, e, p):
    return F.cross_entropy(lg.transpose(1, 2), lb, ignore_index=p, label_smoothing=e)


def _smoothed_by_hand(lg, lb, e, p):
    logp = torch.log_softmax(lg, -1)
    loss = -(1 - e) * logp.gather(-1, lb[..., None])[..., 0] - e * logp.mean(-1)
    return loss[lb != p].mean()


mistakes("check_label_smoothed_loss", [_smoothed, _smoothed_by_hand], [
    (lambda lg, lb, e, p: F.cross_entropy(lg.transpose(1, 2), lb, label_smoothing=e), "the pads are counted"),
    (lambda lg, lb, e, p: checks.lesson08._smoothed_by_hand(lg, lb, e, p, others=True), "V - 1 wrong classes"),
    (lambda lg, lb, e, p: F.cross_entropy(lg.transpose(1, 2), lb, ignore_index=p), "eps is ignored"),
    (lambda lg, lb, e, p: checks.lesson08._smoothed_by_hand(lg, lb, e, p, per_row=True), "each sentence's mean"),
    (checks.lesson08._smoothed_kl, "KL divergence"),
])


# --- lesson 09 ------------------------------------------------------------------------------------

mistakes("check_kv_cache_bytes", [
    lambda n, B, H, L, D, b: 2 * n * B * H * L * D * b,
    lambda n, B, H, L, D, b: math.prod((2, n, B, H, L, D, b)),
], [
    (lambda n, B, H, L, D, b: n * B * H * L * D * b, "both the keys and the values"),
    (lambda n, B, H, L, D, b: 2 * B * H * L * D * b, "every layer caches"),
    (lambda n, B, H, L, D, b: 2 * n * B * H * L * D, "elements, not bytes"),
    (lambda n, B, H, L, D, b: 2 * n * B * L * D * b, "the heads are missing"),
    (lambda n, B, H, L, D, b: 2 * n * B * H * L * L * b, "grows with L * L"),
])


def _kept(T, w, d):
    return sum(min(w, t // d + 1) for t in range(T))


def _kept_closed(T, w, d):
    full = max(0, T - (w - 1) * d)  # queries that see all w keys
    return full * w + sum(min(w, t // d + 1) for t in range(min(T, (w - 1) * d)))


mistakes("check_kept_pairs", [_kept, _kept_closed], [
    (lambda T, w, d: w * T, "that is window * T"),
    (lambda T, w, d: w * T - w * (w - 1) // 2, "sliding-window count"),
    (lambda T, w, d: w * T - d * w * (w - 1) // 2, "assumes T >= (window-1)*dilation"),
    (lambda T, w, d: int(checks.lesson09.dilated_mask(T, w, d).sum()), "as much as a (T, T) mask"),
    (lambda T, w, d: sum(min(w, t + 1) for t in range(T)), "the sliding window's count"),
    (lambda T, w, d: sum(min(w, t // d) for t in range(T)), "off by one"),
    (lambda T, w, d: T * T, "every pair"),
])


def _global(T, w, g):
    s = torch.arange(T)
    causal = s[None, :] <= s[:, None]
    return causal & ((s[:, None] - s[None, :] < w) | (s[None, :] < g))


mistakes("check_global_window_mask", [
    _global, lambda T, w, g: checks.lesson09._global_window(T, w, g),
], [
    (lambda T, w, g: ~_global(T, w, g), "True and False are swapped"),
    (lambda T, w, g: checks.lesson09.sliding_window_mask(T, w) | (torch.arange(T)[None, :] < g).expand(T, T),
     "sees a later global token"),
    (lambda T, w, g: _global(T, w + 1, g), "one too wide"),
    (lambda T, w, g: checks.lesson09.sliding_window_mask(T, w) | ((torch.arange(T)[:, None] < g) & causal_mask(T)),
     "global tokens are rows"),
    (lambda T, w, g: checks.lesson09.sliding_window_mask(T, w), "the global tokens are missing"),
    (lambda T, w, g: _global(T, w, g + 1), "one global token too many"),
])


def _local(q, k, v, window):
    T = q.shape[2]
    out = torch.empty_like(q)
    for start in range(0, T, window):
        end, lo = min(start + window, T), max(0, start - window + 1)
        t = torch.arange(start, end)[:, None]
        s = torch.arange(lo, end)[None, :]
        mask = (s <= t) & (t - s < window)
        out[:, :, start:end] = scaled_dot_product_attention(q[:, :, start:end], k[:, :, lo:end], v[:, :, lo:end],
                                                             mask)[0]
    return out


def _local_per_query(q, k, v, window):
    outs = []
    for t in range(q.shape[2]):
        lo = max(0, t - window + 1)
        outs.append(scaled_dot_product_attention(q[:, :, t:t + 1], k[:, :, lo:t + 1], v[:, :, lo:t + 1])[0])
    return torch.cat(outs, dim=2)


mistakes("check_local_attention", [_local, _local_per_query], [
    (lambda q, k, v, w: checks.lesson09._local_reference(q, k, v, w + 1), "window - 1 keys before it"),
    (lambda q, k, v, w: scaled_dot_product_attention(q, k, v)[0], "the mask is missing"),
    (checks.lesson09._blocks_without_mask, "queries see later keys of their own block"),
    (lambda q, k, v, w: checks.lesson09._local_reference(q, k, v, w), "at least one full (T, T) score matrix"),
    (lambda q, k, v, w: _local(q, k, v, max(w - 1, 1)), "one too narrow"),
])


# --- lesson 11 ------------------------------------------------------------------------------------

def _pool(h, m):
    w = m[..., None].to(h.dtype)
    return (h * w).sum(1) / w.sum(1)


mistakes("check_mean_pool", [
    _pool,
    lambda h, m: torch.stack([h[b][m[b]].mean(0) for b in range(h.shape[0])]),
], [
    (lambda h, m: h.mean(1), "averaged in"),
    (lambda h, m: (h * m[..., None]).sum(1) / h.shape[1], "divided by L"),
    (lambda h, m: F.normalize(_pool(h, m), dim=-1), "normalised to unit length"),
    (lambda h, m: (h * m[..., None]).sum(-1) / m.sum(-1, keepdim=True), "over the features"),
    (lambda h, m: h[:, 0, :], "the [CLS] vector"),
    (lambda h, m: h[:, 0].clone(), "the [CLS] vector"),
    (lambda h, m: (h * m.unsqueeze(-1)).sum(1), "the sum over the real tokens"),
    (lambda h, m: torch.stack([h[b][m[b]].max(0).values for b in range(len(h))]), "max pooling"),
    (lambda h, m: h[m].mean(0, keepdim=True).expand(h.shape[0], -1), "mixes the sentences"),
    (lambda h, m: (h * m[..., None]).sum(1) / m.sum(), "of the whole batch"),
    (lambda h, m: h[:, -1], "the last position"),
])


def _wordpiece_recursive(word, vocab, prefix=""):
    if not word:
        return []
    for end in range(len(word), 0, -1):
        if prefix + word[:end] in vocab:
            rest = _wordpiece_recursive(word[end:], vocab, "##")
            return ["[UNK]"] if rest == ["[UNK]"] else [prefix + word[:end]] + rest
    return ["[UNK]"]


def _wordpiece_shortest(word, vocab):
    return checks.lesson11._wordpiece(word, vocab, longest_first=False)


mistakes("check_wordpiece", [_wordpiece, _wordpiece_recursive], [
    (_wordpiece_shortest, "shortest known piece"),
    (lambda word, vocab: checks.lesson11._wordpiece(word, vocab, prefix=""), 'without "##"'),
    (lambda word, vocab: checks.lesson11._wordpiece(word, vocab, keep_found=True), "pieces found so far"),
    (checks.lesson11._wordpiece_backtracking, "backtracks"),
    (lambda word, vocab: " ".join(_wordpiece(word, vocab)), "return a list of strings"),
])


def _previous(w):
    i = torch.arange(1, w.shape[-1])
    return w[:, i, i - 1].mean(-1)


mistakes("check_previous_token_score", [
    _previous,
    lambda w: torch.diagonal(w, offset=-1, dim1=1, dim2=2).mean(dim=1),
], [
    (lambda w: w.diagonal(dim1=-2, dim2=-1).mean(-1), "on itself"),
    (lambda w: w.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1), "next token"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1) / w.shape[-1], "divided by T"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1)[:, 1:].mean(-1), "starts at i = 2"),
    (lambda w: torch.stack([sum(w[h, i, i - 1] for i in range(1, w.shape[-1])) for h in range(w.shape[0])]),
     "the sum over the queries"),
    (lambda w: w.diagonal(offset=-1, dim1=-2, dim2=-1).max(-1).values, "the largest weight"),
])


def _rank(query, corpus):
    return (F.normalize(corpus, dim=-1) @ F.normalize(query, dim=0)).argsort(descending=True)


mistakes("check_rank_by_cosine", [
    _rank,
    lambda query, corpus: sorted(range(len(corpus)), key=lambda i: -float(F.cosine_similarity(corpus[i], query, 0))),
], [
    (lambda query, corpus: (corpus @ query).argsort(descending=True), "dot product"),
    (lambda query, corpus: _rank(query, corpus).flip(0), "least similar first"),
    (lambda query, corpus: F.cosine_similarity(corpus, query[None], -1).sort(descending=True).values,
     "not the similarities"),
    (lambda query, corpus: _rank(query, corpus).argsort(), "the rank of each row"),
    (lambda query, corpus: F.cosine_similarity(corpus, query[None], -1).sort(descending=True), "return its .indices"),
    (lambda query, corpus: (corpus @ query).argsort(), "the dot product, least similar first"),
    (lambda query, corpus: torch.cdist(corpus, query[None]).squeeze(-1).argsort(), "Euclidean distance"),
])


def _pad(lists, pad_id):
    L = max(map(len, lists))
    ids = torch.tensor([r + [pad_id] * (L - len(r)) for r in lists])
    mask = torch.tensor([[True] * len(r) + [False] * (L - len(r)) for r in lists])
    return ids, mask


def _pad_sequence(lists, pad_id):
    rows = [torch.tensor(r, dtype=torch.long) for r in lists]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad_id)
    lengths = torch.tensor([len(r) for r in lists])
    return ids, torch.arange(ids.shape[1])[None, :] < lengths[:, None]


mistakes("check_pad_batch", [_pad, _pad_sequence], [
    (lambda lists, p: (_pad(lists, p)[0], ~_pad(lists, p)[1]), "polarity is flipped"),
    (lambda lists, p: checks.lesson11._pad_batch(lists, p, left=True), "on the left"),
    (lambda lists, p: (_pad(lists, p)[0], _pad(lists, p)[0] != p), "ids != pad_id"),
    (lambda lists, p: (_pad(lists, 0)[0], _pad(lists, p)[1]), "whatever pad_id is"),
    (lambda lists, p: (_pad(lists, p)[0], _pad(lists, p)[1].long()), "dtype torch.bool"),
])

# --- lesson 12 ------------------------------------------------------------------------------------

def _top_p(logits, top_p):
    probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
    keep = probs.cumsum(-1) - probs < top_p  # the mass before each token is below top_p
    return logits.masked_fill(~torch.zeros_like(keep).scatter(-1, order, keep), float("-inf"))


def _top_p_loop(logits, top_p):
    out = torch.full_like(logits, float("-inf"))
    for row, o in zip(logits.reshape(-1, logits.shape[-1]), out.view(-1, logits.shape[-1]), strict=True):
        total = 0.0
        for i in torch.softmax(row.double(), -1).argsort(descending=True).tolist():
            o[i] = row[i]
            total += torch.softmax(row.double(), -1)[i].item()
            if total >= top_p:
                break
    return out


def _drops_crossing(x, p):
    s, o = torch.softmax(x, -1).sort(-1, descending=True)
    return x.masked_fill(~torch.zeros_like(s, dtype=torch.bool).scatter(-1, o, s.cumsum(-1) <= p), float("-inf"))


mistakes("check_top_p_filter", [_top_p, _top_p_loop], [
    (_drops_crossing, "the token that crosses top_p was dropped"),
    (lambda x, p: _top_p(x, p).sort(-1, descending=True).values, "sorted order"),
    (lambda x, p: _top_p(x, p).nan_to_num(neginf=0.0), "not 0"),
])

mistakes("check_temperature_sample", [
    lambda x, t, g: torch.multinomial(torch.softmax(x / t, dim=-1), 1, generator=g),
    lambda x, t, g: torch.multinomial(F.softmax(x.div(t), -1), num_samples=1, generator=g),
], [
    (lambda x, t, g: torch.multinomial(torch.softmax(x * t, dim=-1), 1, generator=g), "multiplied"),
    (lambda x, t, g: x.argmax(-1, keepdim=True), "greedy"),
    (lambda x, t, g: torch.multinomial(torch.softmax(x / t, 0), 1, generator=g), "dim=-1"),
])


def _bpc_gather(model, vocab, text):
    ids = torch.tensor([vocab.encode(text)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids)[0, :-1], dim=-1)  # (L - 1, V)
    return -logp.gather(-1, ids[0, 1:, None]).mean().item() / math.log(2)


mistakes("check_bits_per_char", [_bpc, _bpc_gather], [
    (lambda m, v, t: _bpc(m, v, t) * math.log(2), "nats"),
    (lambda m, v, t: _bpc(m, v, t) * (len(t) - 1), "the total"),
])


def _cached_step_indexed(model, caches, token):
    x = model.embed(token)  # (B, 1, C)
    x = model.pos(x, offset=caches[0].length)  # the newest token sits after the cached ones
    for i, block in enumerate(model.blocks):
        x = block(x, None, False, caches[i])
    return model.head(model.norm(x))[:, -1]  # (B, V)


mistakes("check_cached_step", [_cached_step, _cached_step_indexed], [
    (_no_offset, "caches[0].length"),
    (_no_norm, "final LayerNorm"),
])


# --- lesson 13 ------------------------------------------------------------------------------------

def _batched(w):
    return w if w.dim() == 4 else w[None]


def _prev_diag(w):
    return _batched(w).diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))


mistakes("check_batched_previous_token_score", [_prev_score13, _prev_diag], [
    (lambda w: _batched(w).diagonal(0, -2, -1).mean(dim=(0, 2)), "main diagonal"),
    (lambda w: _batched(w).diagonal(1, -2, -1).mean(dim=(0, 2)), "the future"),
    (lambda w: _batched(w).diagonal(-1, -2, -1).sum(-1).mean(0) / w.shape[-1], "queries 1..T-1"),
    (lambda w: w.diagonal(-1, -2, -1).mean(-1), "average over the batch"),
])


def _ind_diag(w, p):
    return _batched(w).diagonal(offset=1 - p, dim1=-2, dim2=-1)[..., 1:].mean(dim=(0, 2))


def _ind_key(shift, first_shift=0):
    def fn(w, p):
        T = w.shape[-1]
        return torch.stack([_batched(w)[:, :, i, i - p + 1 + shift] for i in range(p + first_shift, T)],
                           dim=-1).mean(dim=(0, 2))
    return fn


mistakes("check_induction_score", [_ind_score13, _ind_diag], [
    (_ind_key(-1), "earlier copy of the current token itself"),
    (_ind_key(+1), "i - period + 2"),
    (_ind_key(0, first_shift=-1), "start one too early"),
    (lambda w, p: _batched(w).diagonal(-1, -2, -1).mean(dim=(0, 2)), "previous-token score"),
])


def _zero_hook_mask(head, head_dim):
    def hook(module, args):
        keep = torch.ones(args[0].shape[-1])
        keep[head * head_dim:(head + 1) * head_dim] = 0.0
        return (args[0] * keep,)
    return hook


def _hook_editing(edit):
    def make(head, head_dim):
        def hook(module, args):
            x = args[0].clone()
            edit(x, head, head_dim)
            return (x,)
        return hook
    return make


mistakes("check_zero_head_hook", [_zero_hook13, _zero_hook_mask], [
    (_hook_editing(lambda x, h, d: x.__setitem__((..., h), 0.0)), "only one column"),
    (_hook_editing(lambda x, h, d: x.__setitem__((slice(None), slice(h * d, h * d + d)), 0.0)), "positions"),
    (_hook_editing(lambda x, h, d: x.__setitem__((..., slice(h * d + d, h * d + 2 * d)), 0.0)), "head h + 1"),
])


def _table_loop(model, ids, periods):
    from helpers.heads import attention_modules, copy_accuracy

    rows = [[copy_accuracy(model, ids, periods, ablate=[(layer, head)])[1] for head in range(attn.n_heads)]
            for layer, attn in enumerate(attention_modules(model))]
    return torch.tensor(rows)


def _table_drop(model, ids, periods):
    from helpers.heads import copy_accuracy

    return copy_accuracy(model, ids, periods)[1] - _table_loop(model, ids, periods)


mistakes("check_ablation_table", [_table13, _table_loop], [
    (lambda m, i, p: _table_loop(m, i, p).T, "(L, H), not (H, L)"),
    (_table_drop, "drop"),
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


def test_every_exercise_check_but_lesson_10s_is_in_the_table():
    names = {name for name in dir(checks) if name.startswith("check_") and not name.startswith("check_predict")
             and name != "check_prediction" and getattr(checks, name).__module__ != "helpers.checks.lesson10"}
    assert names == set(TABLE), (names - set(TABLE), set(TABLE) - names)


def test_at_most_one_rejection_in_ten_is_generic(capsys):
    """Over every wrong answer of the table, the share of lines that only say "values differ" or the like."""
    generic = total = 0
    for name, (_, wrongs) in TABLE.items():
        for wrong, _ in wrongs:
            _, line = _line(getattr(checks, name), wrong, capsys)
            total += 1
            generic += any(g in line for g in GENERIC) and not any(w in line for _, w in wrongs)
    assert total >= 150 and generic <= total // 10, (generic, total)
