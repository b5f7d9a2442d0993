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


def _way2(q, k, v, mask, max_over_allowed=True, guard=True, renormalise=True):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    mask = mask.expand_as(scores)
    top = torch.where(mask, scores, torch.finfo(scores.dtype).min) if max_over_allowed else scores
    e = torch.where(mask, torch.exp(scores - top.amax(-1, keepdim=True)), 0.0)
    if not renormalise:
        w = torch.softmax(scores, -1) * mask
    else:
        w = e / (e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny) if guard else e.sum(-1, keepdim=True))
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
    T = x.shape[1]
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
    return torch.block_diag(*[torch.stack([torch.stack([ci, si]), torch.stack([-si, ci])]) for ci, si in zip(c, s)])


mistakes("check_shift_matrix", [_shift, lambda k, d: _shift_block_diag(k, d).float()], [
    (lambda k, d: _shift(k, d).T, "the transpose"),
    (lambda k, d: _shift(k, d).T.contiguous() if False else checks.lesson06._shift_matrix_with(
        k, d, 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d)), "10000^(-i/d_model)"),
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
    lambda T, s: -s * torch.cdist(torch.arange(T.__float__() if False else T).float()[:, None],
                                  torch.arange(T).float()[:, None]),
], [
    (lambda T, s: s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float(), "sign is flipped"),
    (lambda T, s: -s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float(), "without abs()"),
    (lambda T, s: (-s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float()).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), "causal mask"),
    (lambda T, s: -(torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float(), "slope is missing"),
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
