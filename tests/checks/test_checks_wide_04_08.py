"""Lessons 04-08: a wide set of plausible wrong answers, beyond the table of test_checks_mistakes.py.

Each wrong answer must be rejected with one line and no traceback, and at most one rejection in ten,
over these answers and the table's rows of lessons 04-08, may be generic ("values differ", "got X,
expected Y", a shape alone, or "find the step of your reasoning that differs").
"""

import re

import torch
import torch.nn.functional as F
from test_checks_mistakes import TABLE

from helpers import checks
from helpers.positional import apply_rotary

LESSONS = ("lesson04", "lesson05", "lesson06", "lesson07", "lesson08")
PREDICTIONS = {"check_predict_weights_ratio": [1, 1 / 8, 64, 2, 16],
               "check_predict_causal_fraction": [0.5, 0.45, 55, 45, 1.0],
               "check_predict_self_dot": [64, 1, 0, 8, 32**0.5, 37]}
WIDE = {}


def wrong(name, *answers):
    WIDE.setdefault(name, []).extend(answers)


def _sdpa(q, k, v, mask=None, scale=None, dim=-1):
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=dim).nan_to_num(0.0)
    return w @ v, w


# --- lesson 04 ---
wrong("check_mha_param_count",
      lambda d, h, b=True: 4 * d * (d // h) + (4 * d if b else 0),  # one head's slice
      lambda d, h, b=True: 4 * d * d + (4 if b else 0),  # one bias number per matrix
      lambda d, h, b=True: 4 * d * d + (d if b else 0),  # one bias vector
      lambda d, h, b=True: 4 * d * d + (4 * d * h if b else 0))  # biases per head


def _split_no_t(x, w, b, h):
    B, T, C = x.shape
    return tuple(t.view(B, T, h, C // h) for t in F.linear(x, w, b).split(C, -1))


wrong("check_split_qkv",
      _split_no_t,  # (B, T, H, D)
      lambda x, w, b, h: tuple(t.transpose(-2, -1) for t in checks.lesson04.split_qkv_reference(x, w, b, h)),
      lambda x, w, b, h: tuple(t.view(x.shape[0], x.shape[1], x.shape[2] // h, h).transpose(1, 2)
                               for t in F.linear(x, w, b).split(x.shape[2], -1)),  # H and D swapped: (B, D, T, H)
      lambda x, w, b, h: checks.lesson04.split_qkv_reference(x, w, b, h)[::-1])  # (v, k, q)

wrong("check_grouped_query_attention",
      lambda q, k, v: _sdpa(q, k.repeat_interleave(q.shape[1] // k.shape[1], 1),
                            v.repeat_interleave(q.shape[1] // k.shape[1], 1), scale=1.0)[0],  # no 1/sqrt(D)
      lambda q, k, v: _sdpa(q, k.repeat_interleave(q.shape[1] // k.shape[1], 1),
                            v.repeat_interleave(q.shape[1] // k.shape[1], 1), dim=-2)[0],  # softmax over queries
      lambda q, k, v: _sdpa(q, k.repeat_interleave(q.shape[1] // k.shape[1], 1),
                            v.repeat_interleave(q.shape[1] // k.shape[1], 1))[1],  # the weights
      lambda q, k, v: _sdpa(q, v.repeat_interleave(q.shape[1] // k.shape[1], 1),
                            k.repeat_interleave(q.shape[1] // k.shape[1], 1))[0])  # k and v swapped

wrong("check_pattern_mass",
      lambda w, p: (w * ~p).sum(-1)[..., p.any(-1)].mean(dim=(0, 2)),  # off the pattern
      lambda w, p: (w * p.T).sum(-1)[..., p.any(-1)].mean(dim=(0, 2)),  # pattern transposed
      lambda w, p: (w * p).sum(-1)[..., p.any(-1)].mean(dim=0),  # (H, T'): no mean over queries
      lambda w, p: ((w * p).sum(-1) / p.sum(-1).clamp_min(1))[..., p.any(-1)].mean(dim=(0, 2)),  # per True key
      lambda w, p: (w * p).sum(-1)[..., p.any(-1)].mean())  # one number


# --- lesson 05 ---
wrong("check_causal_mask",
      lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(T - S),  # offset sign
      lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T + 1),  # one step into the future
      lambda T, S: torch.ones(S, T, dtype=torch.bool).tril(S - T),  # (S, T)
      lambda T, S: torch.zeros(T, S).masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), float("-inf")))

wrong("check_padding_mask",
      lambda ids, p: (ids != p)[:, None, :],  # (B, 1, S)
      lambda ids, p: (ids > p)[:, None, None, :],  # pad is not the smallest id
      lambda ids, p: (torch.arange(ids.shape[1]) < (ids != p).sum(-1, keepdim=True))[:, None, None, :],  # lengths
      lambda ids, p: (ids != p)[:, None, None, :].float())


def _way2_inf0(q, k, v, mask):  # exp of every score minus the max over the allowed ones, then * mask
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    m = mask.expand_as(s)
    top = torch.where(m, s, torch.finfo(s.dtype).min).amax(-1, keepdim=True)
    e = torch.exp(s - top) * m
    w = e / e.sum(-1, keepdim=True).clamp_min(1e-30)
    return w @ v, w


def _way2_scale(q, k, v, mask, scale, dim=-1):
    s = q @ k.transpose(-2, -1) * scale
    m = mask.expand_as(s)
    top = torch.where(m, s, torch.finfo(s.dtype).min).amax(dim, keepdim=True)
    e = torch.where(m, torch.exp(s - top), 0.0)
    w = e / e.sum(dim, keepdim=True).clamp_min(1e-30)
    return w @ v, w


wrong("check_masked_attention",
      _way2_inf0,
      lambda q, k, v, m: _way2_scale(q, k, v, m, 1.0),  # no 1/sqrt(D)
      lambda q, k, v, m: _way2_scale(q, k, v, m, 1 / q.shape[-1]),  # 1/D
      lambda q, k, v, m: _way2_scale(q, k, v, m, q.shape[-1] ** -0.5, dim=-2),  # normalised over queries
      lambda q, k, v, m: _way2_scale(q, k, v, m, q.shape[-1] ** -0.5)[0])  # only the output

wrong("check_mha_masks",
      lambda c, p: (~c, ~p[:, 0]),  # (B, 1, S)
      lambda c, p: (torch.zeros(c.shape).masked_fill(~c, float("-inf")),
                    torch.zeros(p[:, 0, 0].shape).masked_fill(~p[:, 0, 0], float("-inf"))),  # float masks
      lambda c, p: (~c.T, ~p[:, 0, 0]))  # the transposed causal mask


def _leaks_from_t(f, x):  # changes input t too
    base = f(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t:] = changed[:, t:] + 1.0
        if not torch.allclose(f(changed)[:, : t + 1], base[:, : t + 1], atol=1e-6):
            return True
    return False


def _leaks_all_outputs(f, x):  # compares every output, not only 0..t
    base = f(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1:] = changed[:, t + 1:] + 1.0
        if not torch.allclose(f(changed), base, atol=1e-6):
            return True
    return False


wrong("check_leaks_future",
      lambda f, x: True, lambda f, x: False,
      lambda f, x: not checks.lesson05._leaks(f, x),  # the answer inverted
      _leaks_from_t, _leaks_all_outputs)


# --- lesson 06 ---
def _shift_with(k, d, omega):
    return checks.lesson06._shift_matrix_with(k, d, omega)


wrong("check_shift_matrix",
      lambda k, d: _shift_with(k, d, 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / (d // 2))),
      lambda k, d: _shift_with(k, d, torch.ones(d // 2, dtype=torch.float64)),  # no frequencies
      lambda k, d: _shift_with(k, d, 1000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)))  # base


def _dist(n, d, combine=lambda p, q: p[:, None] - q[None, :], reduce="sum"):
    pos = torch.arange(n, dtype=torch.float64)
    c = torch.cos(combine(pos, pos)[..., None] * checks.lesson06._omega(d))
    return (c.sum(-1) if reduce == "sum" else c.mean(-1) if reduce == "mean" else c).float()


wrong("check_distance_scores",
      lambda n, d: _dist(n, d, combine=lambda p, q: p[:, None] + q[None, :]),  # cos((p + q) w)
      lambda n, d: _dist(n, d, reduce="mean"),
      lambda n, d: _dist(n, d, reduce=None),  # not summed over the pairs
      lambda n, d: _dist(n, d, combine=lambda p, q: p[:, None] * q[None, :]))  # cos(p q w)


def _rot(x, offset=0, swap=False):
    T, D = x.shape[-2], x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = (torch.arange(T, dtype=torch.float64)[:, None] + offset) * theta
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    a, b = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return torch.cat((b, a) if swap else (a, b), dim=-1)


wrong("check_rotate_half",
      lambda x: _rot(x, offset=1),  # positions from 1
      lambda x: _rot(x, swap=True),  # halves swapped in the output
      lambda x: torch.cat((x[..., : x.shape[-1] // 2] * _rot(torch.ones_like(x))[..., : x.shape[-1] // 2],
                           x[..., x.shape[-1] // 2:]), dim=-1))  # only the first half turned

wrong("check_alibi_bias",
      lambda T, s: -s * (torch.arange(T)[None, :] - torch.arange(T)[:, None]).float(),  # (n - m), no abs
      lambda T, s: checks.lesson06._alibi(T, s).tril(),  # 0 above the diagonal
      lambda T, s: checks.lesson06._alibi(T, s)[None],  # (1, T, T)
      lambda T, s: checks.lesson06._alibi(T, s).double())

# --- lesson 07 ---
wrong("check_rms_norm",
      lambda x, g, eps=1e-6: g * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps),  # the L2 norm
      lambda x, g, eps=1e-6: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps),  # no gain
      lambda x, g, eps=1e-6: g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True)),  # no eps
      lambda x, g, eps=1e-6: g * x / (x.pow(2).mean(-1, keepdim=True) + eps),  # no square root
      lambda x, g, eps=1e-6: g * x / torch.sqrt(x.var(-1, keepdim=True) + eps),  # the variance
      lambda x, g, eps=1e-6: g + x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))  # gain added

wrong("check_feed_forward_gelu",
      lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T) @ w2.T + b2,  # b1 missing
      lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T + b1) @ w2.T,  # b2 missing
      lambda x, w1, b1, w2, b2: x + F.gelu(x @ w1.T + b1) @ w2.T + b2,  # a residual
      lambda x, w1, b1, w2, b2: F.silu(x @ w1.T + b1) @ w2.T + b2)

wrong("check_deepnorm_sublayer",
      lambda x, f, n, a: n(a * x) + f(x),
      lambda x, f, n, a: n(x + f(a * x)),
      lambda x, f, n, a: x + n(a * x + f(x)),
      lambda x, f, n, a: a * n(x + f(x)))


def _rope(x, mha, scale=None, mask=None, merge="right", dim=-1):
    B, T, C = x.shape
    H, D = mha.n_heads, C // mha.n_heads
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (mha.w_q(x), mha.w_k(x), mha.w_v(x)))
    out = _sdpa(apply_rotary(q), apply_rotary(k), v, mask=mask, scale=scale, dim=dim)[0]
    out = out.transpose(1, 2).reshape(B, T, C) if merge == "right" else out.reshape(B, T, C)
    return mha.w_o(out)


wrong("check_rope_attention",
      lambda x, m: _rope(x, m, scale=1.0),  # no 1/sqrt(D)
      lambda x, m: _rope(x, m, scale=x.shape[-1] ** -0.5),  # 1/sqrt(C)
      lambda x, m: _rope(x, m, mask=torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()),  # causal
      lambda x, m: _rope(x, m, merge="no transpose"),
      lambda x, m: _rope(x, m, dim=-2))

wrong("check_swiglu",
      lambda x, a, b, c: (F.relu(x @ a.T) * (x @ b.T)) @ c.T,
      lambda x, a, b, c: x + (F.silu(x @ a.T) * (x @ b.T)) @ c.T,
      lambda x, a, b, c: F.silu(x @ a.T) * (x @ b.T))  # no down-projection

# --- lesson 08 ---
wrong("check_teacher_forcing",
      lambda t: (t[:-1], t[1:]),  # the batch axis sliced
      lambda t: (t[:, :-1], t),  # labels not cut
      lambda t: (t[:, 1:-1], t[:, 2:]))


def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


wrong("check_decoder_self_mask",
      lambda t, p: _causal(t.shape[1]) & (t != p)[:, None, None, :] & (t != p)[:, None, :, None],  # rows and cols
      lambda t, p: _causal(t.shape[1]) & (t == p)[:, None, None, :],  # padding polarity
      lambda t, p: _causal(t.shape[1]) & (t != 0)[:, None, None, :],  # pad_id ignored
      lambda t, p: _causal(t.shape[1])[None, None])  # (1, 1, T, T)


def _greedy(lg, ys, f, e, p, fill=None, prev=False, dim=-1):
    best = lg.argmax(dim=dim)
    if dim != -1:
        best = best[: lg.shape[0]] if best.shape[0] >= lg.shape[0] else best.repeat(lg.shape[0])[: lg.shape[0]]
    best = torch.where(f, torch.full_like(best, p if fill is None else fill), best)
    done = (ys[:, -1] == e) if prev else (best == e)
    return torch.cat((ys, best[:, None]), 1), f | done


wrong("check_greedy_step",
      lambda lg, ys, f, e, p: _greedy(lg, ys, f, e, p, fill=e),  # finished rows grow eos
      lambda lg, ys, f, e, p: _greedy(lg, ys, f, e, p, prev=True),  # looks at the previous token
      lambda lg, ys, f, e, p: _greedy(lg, ys, f, e, p, dim=0))  # argmax over the batch

wrong("check_length_normalised_score",
      lambda lp, n, a: lp / ((5 + n) / 6),  # alpha ignored
      lambda lp, n, a: lp / ((5 + n) ** a / 6),
      lambda lp, n, a: ((5 + n) / 6) ** a,  # the penalty alone
      lambda lp, n, a: lp - ((5 + n) / 6) ** a)  # subtracted


def _kl(lg, lb, e, p):  # the Annotated Transformer's KLDivLoss: cross-entropy minus the target's entropy
    V = lg.shape[-1]
    target = torch.full(lg.shape, e / V)
    target.scatter_(-1, lb[..., None], 1 - e + e / V)
    real = lb != p
    kl = F.kl_div(torch.log_softmax(lg, -1), target, reduction="none").sum(-1)
    return kl[real].mean()


wrong("check_label_smoothed_loss",
      lambda lg, lb, e, p: F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lb.reshape(-1), ignore_index=p,
                                           label_smoothing=e, reduction="sum"),
      lambda lg, lb, e, p: F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lb.reshape(-1), ignore_index=0,
                                           label_smoothing=e),
      _kl)


def _lesson_checks():
    return sorted(n for n in dir(checks) if n.startswith("check_")
                  and getattr(checks, n).__module__.rsplit(".", 1)[-1] in LESSONS)


def _line(check, answer, capsys):
    capsys.readouterr()
    ok = check(answer)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    return bool(ok), lines[0]


_GENERIC = re.compile(r"values differ from the reference \(largest difference|\d+ of \d+ entries differ from the "
                      r"reference$|: got [^:]*, expected [^ ]+$|shape \([^)]*\), but the reference gives \([^)]*\)$|"
                      r"contains NaN where the reference has none|find the step of your reasoning that differs")


def _generic(line):
    """A line that says only that the answer differs, not what the mistake is."""
    return bool(_GENERIC.search(line))


def rejections(capsys):
    """(check name, line, generic?) for every wrong answer of the wide set and of the table, lessons 04-08."""
    out = []
    for name in _lesson_checks():
        answers = PREDICTIONS.get(name, []) + WIDE.get(name, []) + [w for w, _ in TABLE.get(name, ([], []))[1]]
        for answer in answers:
            ok, line = _line(getattr(checks, name), answer, capsys)
            assert not ok and line.startswith("✗"), (name, line)
            out.append((name, line, _generic(line)))
    return out


def test_every_check_of_lessons_04_to_08_has_wide_wrong_answers():
    assert set(_lesson_checks()) == set(WIDE) | set(PREDICTIONS)


def test_at_most_one_rejection_in_ten_is_generic(capsys):
    lines = rejections(capsys)
    generic = [(n, line) for n, line, g in lines if g]
    assert len(lines) >= 150 and len(generic) * 10 <= len(lines), (len(generic), len(lines), generic)


if __name__ == "__main__":
    class _Capsys:  # a stand-in for pytest's fixture, to print the figures
        def __init__(self):
            import io
            import sys
            self.sys, self.io = sys, io
            self.buf = io.StringIO()
            sys.stdout = self.buf

        def readouterr(self):
            text, self.buf = self.buf.getvalue(), self.io.StringIO()
            self.sys.stdout = self.buf
            return type("R", (), {"out": text})()

    cap = _Capsys()
    rows = rejections(cap)
    cap.sys.stdout = cap.sys.__stdout__
    for _name, line, g in rows:
        if g:
            print("GENERIC", line)
    print(f"{sum(g for *_, g in rows)} generic of {len(rows)} rejections")
