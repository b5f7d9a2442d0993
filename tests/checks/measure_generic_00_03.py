# ruff: noqa
"""Share of generic rejections over plausible wrong answers to the checks of lessons 00-03 (and basics).

Not a test (pytest does not collect it): run `PYTHONPATH=. python tests/checks/measure_generic_00_03.py -v`.
A rejection is generic when it only says "values differ", "got X, expected Y", a bare shape or dtype
mismatch, or "find the step of your reasoning"; a hint that names the slip (a sign, a factor, a transpose)
counts as named. Measured: 96 of 177 rejections generic before issue 32 (2 wrong answers accepted), 6 of 179 after.
"""
import io, contextlib, math, re, sys
import torch
import torch.nn.functional as F
from helpers import checks as C
from helpers.attention import scaled_dot_product_attention as sdpa

GENERIC = ("values differ from the reference", "entries differ from the reference", ", expected ",
           "shape (", "contains NaN where the reference has none", "find the step of your reasoning")

GENERIC_RE = (r"values differ from the reference", r"entries differ from the reference", r": got .*, expected ",
              r"shape \(.*\), but the reference gives", r"contains NaN where", r"find the step of your reasoning",
              r"expected a tuple of \d results", r"return dtype ")
HINTS = (": your values have the opposite sign", "an extra axis of size 1", "an axis of size 1 is missing",
         "the last two axes are swapped", "times the right ones", "a .double()", "transpose of the right one",
         "the same number of entries in another shape")
def sm(x, d=-1): return torch.softmax(x, d)
def tr(x): return x.transpose(-2, -1)
W = {}
def add(name, *fns): W.setdefault(name, []).extend(fns)

# lesson 00
add("check_split_heads",
    lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1),
    lambda x, h: x.view(x.shape[0], x.shape[1], h, -1),
    lambda x, h: x.reshape(x.shape[0], x.shape[1], -1, h).transpose(1, 2),
    lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).transpose(1, 2).transpose(-2, -1),
    lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).permute(0, 2, 3, 1),
    lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).transpose(0, 2),
    lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1).double(),
    lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).transpose(1, 2).numpy(),
    lambda x, h: x.reshape(x.shape[0], x.shape[1], -1, h).permute(0, 3, 1, 2),
)
add("check_merge_heads",
    lambda x: x.reshape(x.shape[0], x.shape[2], -1),
    lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1),
    lambda x: x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1).transpose(1, 2),
    lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1),
    lambda x: x.transpose(1, 2),
    lambda x: x.reshape(x.shape[0], -1, x.shape[-1] * x.shape[1]),
    lambda x: x.transpose(1, 2).reshape(x.shape[0], -1),
)
add("check_scores_shape",
    lambda B, H, T, S: (B, H, S, T), lambda B, H, T, S: (B, T, S), lambda B, H, T, S: (B, T, H, S),
    lambda B, H, T, S: (B, H, T, T), lambda B, H, T, S: torch.zeros(B, H, T, S),
    lambda B, H, T, S: (B, H, T, S, S), lambda B, H, T, S: (B * H, T, S), lambda B, H, T, S: (H, T, S),
    lambda B, H, T, S: B * H * T * S, lambda B, H, T, S: f"({B}, {H}, {T}, {S})",
)
# lesson 01
def add_s(s, h, W_, U, b, v): return (s @ W_.T)[:, None, :] + h @ U.T
add("check_additive_scores",
    lambda s, h, W_, U, b, v: (add_s(s, h, W_, U, b, v) + b) @ v,
    lambda s, h, W_, U, b, v: torch.tanh((s @ W_)[:, None, :] + h @ U + b) @ v,
    lambda s, h, W_, U, b, v: torch.tanh(add_s(s, h, W_, U, b, v)) @ v,
    lambda s, h, W_, U, b, v: torch.tanh(add_s(s, h, W_, U, b, v) + b).sum(-1),
    lambda s, h, W_, U, b, v: sm(torch.tanh(add_s(s, h, W_, U, b, v) + b) @ v),
    lambda s, h, W_, U, b, v: (torch.tanh(add_s(s, h, W_, U, b, v)) + b) @ v,  # bias after tanh
    lambda s, h, W_, U, b, v: torch.tanh(add_s(s, h, W_, U, b, v)) @ v + b.sum(),
    lambda s, h, W_, U, b, v: torch.tanh(h @ U.T + b) @ v,  # no query term
    lambda s, h, W_, U, b, v: torch.tanh((s @ W_.T)[:, None, :] + h + b) @ v if h.shape[-1] == W_.shape[0] else torch.tanh((s @ W_.T)[:, None, :] + b).expand(-1, h.shape[1], -1) @ v,
    lambda s, h, W_, U, b, v: torch.relu(add_s(s, h, W_, U, b, v) + b) @ v,
    lambda s, h, W_, U, b, v: torch.sigmoid(add_s(s, h, W_, U, b, v) + b) @ v,
    lambda s, h, W_, U, b, v: torch.tanh(add_s(s, h, W_, U, b, v) + b) @ v / math.sqrt(v.shape[0]),
    lambda s, h, W_, U, b, v: -(torch.tanh(add_s(s, h, W_, U, b, v) + b) @ v),
    lambda s, h, W_, U, b, v: torch.tanh(add_s(s, h, W_, U, b, v) + b).double() @ v.double(),
)
def read(s, h, m):
    w = sm(s.masked_fill(~m, float("-inf")))
    return (w[:, None] @ h)[:, 0], w
add("check_attention_read",
    lambda s, h, m: read(s, h, torch.ones_like(m)),
    lambda s, h, m: read(s, h, ~m),
    lambda s, h, m: read(s.masked_fill(~m, 0.0), h, torch.ones_like(m)),
    lambda s, h, m: read(s, h, m)[::-1],
    lambda s, h, m: ((sm(s, 0) * m)[:, None] @ h)[:, 0] if False else (lambda w: ((w[:, None] @ h)[:, 0], w))(sm(s.masked_fill(~m, float("-inf")), 0)),  # softmax over dim 0
    lambda s, h, m: (lambda w: ((w[:, None] @ h)[:, 0], w))(sm(s) * m),  # mask after softmax, no renormalise
    lambda s, h, m: (lambda w: ((w[:, None] @ h)[:, 0], w))(torch.exp(s) * m / (torch.exp(s) * m).sum(-1, keepdim=True)),  # no max
    lambda s, h, m: (lambda w: ((w[:, None] @ h)[:, 0], w))(sm(s.masked_fill(~m, float("-inf")))).__getitem__(0),
    lambda s, h, m: (lambda w: (h.sum(1), w))(sm(s.masked_fill(~m, float("-inf")))),
    lambda s, h, m: (lambda w: ((w[:, :, None] * h).mean(1), w))(sm(s.masked_fill(~m, float("-inf")))),
    lambda s, h, m: (lambda w: ((w[:, None] @ h)[:, 0], w))(sm(s.masked_fill(m, float("-inf")))),
    lambda s, h, m: (lambda w: ((w[:, None] @ h)[:, 0], w[:, :, None]))(sm(s.masked_fill(~m, float("-inf")))),

)
def _grad(rnn, x, position=-1):
    x = x.detach().clone().requires_grad_(True)
    rnn(x[None])[0][0, position].sum().backward()
    return x.grad
def _norms(rnn, x): return _grad(rnn, x).norm(dim=-1)
def all_states(rnn, x):
    x = x.detach().clone().requires_grad_(True); rnn(x[None])[0].sum().backward(); return x.grad.norm(dim=-1)
def callers(rnn, x):
    x.requires_grad_(True); rnn(x[None])[0][0, -1].sum().backward(); return x.grad.norm(dim=-1)
add("check_input_gradient_norms",
    all_states, callers, lambda r, x: _norms(r, x) ** 2, lambda r, x: _grad(r, x).norm(dim=0),
    lambda r, x: _grad(r, x, 0).norm(dim=-1), lambda r, x: _grad(r, x).abs().sum(-1),
    lambda r, x: _grad(r, x), lambda r, x: _norms(r, x).flip(0), lambda r, x: _grad(r, x).sum(-1),
    lambda r, x: _norms(r, x) / _norms(r, x)[-1],
)
def acc(w, n, target=lambda L, i: L - 1 - i, rows=None, axis=-1, S=False, mean=False):
    hits = total = 0; per = []
    for b, L in enumerate(n.tolist()):
        R = w.shape[1] if rows == "all" else L
        best = w[b, :R].argmax(axis) if axis == -1 else w[b, :L, :L].argmax(0)
        tgt = torch.tensor([target(w.shape[-1] if S else L, i) for i in range(R)])
        h = (best == tgt).sum().item(); hits += h; total += R; per.append(h / R)
    return sum(per) / len(per) if mean else hits / total
add("check_alignment_accuracy",
    lambda w, n: acc(w, n, axis=0), lambda w, n: acc(w, n, S=True), lambda w, n: acc(w, n, mean=True),
    lambda w, n: 100 * acc(w, n), lambda w, n: str(acc(w, n)),
    lambda w, n: acc(w, n, target=lambda L, i: i),  # diagonal, not anti-diagonal
    lambda w, n: acc(w, n, target=lambda L, i: L - i),  # off by one
    lambda w, n: acc(w, n, rows="all"),  # counts padded output rows
    lambda w, n: int(acc(w, n) * sum(n.tolist())),  # the count of hits
    lambda w, n: 1 - acc(w, n),
)
# lesson 02
add("check_one_query",
    lambda q, k, v: sm(k @ q) @ v, lambda q, k, v: v.mean(0), lambda q, k, v: (k @ q / math.sqrt(q.shape[0])) @ v,
    lambda q, k, v: sm(k @ q / math.sqrt(q.shape[0])), lambda q, k, v: sm(k @ q / q.shape[0]) @ v,
    lambda q, k, v: sm(k @ q / math.sqrt(k.shape[0])) @ v,  # sqrt(S)
    lambda q, k, v: v.sum(0), lambda q, k, v: v[(k @ q).argmax()],
    lambda q, k, v: sm(k @ q * math.sqrt(q.shape[0])) @ v,
    lambda q, k, v: (sm(k @ q / math.sqrt(q.shape[0])) @ v)[None],
    lambda q, k, v: sm(-(k @ q) / math.sqrt(q.shape[0])) @ v,
)
def sa(x, wq, wk, wv, scale=None, dim=-1, swap=False, qk=None):
    q, k, vv = x @ wq, x @ wk, x @ wv
    if qk == "kq": q, k = k, q
    s = q @ tr(k) / math.sqrt(q.shape[-1] if scale is None else scale(x, wq))
    w = sm(s, dim)
    return (w, w @ vv) if swap else (w @ vv, w)
add("check_self_attention",
    lambda x, a, b, c: sdpa(x @ a, x @ b, x), lambda x, a, b, c: sa(x, a, b, c, scale=lambda x, w: x.shape[-1]),
    lambda x, a, b, c: sa(x, a, b, c, scale=lambda x, w: 1.0), lambda x, a, b, c: sa(x, a, b, c, dim=-2),
    lambda x, a, b, c: sa(x, a, b, c, qk="kq"), lambda x, a, b, c: sa(x, a, b, c, swap=True),
    lambda x, a, b, c: sa(x, a, a, c),
    lambda x, a, b, c: sa(x, a, b, c, dim=0),  # softmax over dim 0
    lambda x, a, b, c: (lambda q, k, vv: (sm(q @ k.T / math.sqrt(q.shape[-1])) @ vv, sm(q @ k.T / math.sqrt(q.shape[-1]))))(x @ a, x @ b, x @ c),
    lambda x, a, b, c: sa(x, a, b, c)[0],
    lambda x, a, b, c: sa(x, a.T, b.T, c.T),
    lambda x, a, b, c: sa(x, a, b, c, scale=lambda x, w: w.shape[-1] ** 2),  # divides by D
)
add("check_hard_lookup",
    lambda q, k, v: v[torch.cdist(q, k).argmin(1)], lambda q, k, v: sm(q @ k.T / q.shape[-1] ** 0.5) @ v,
    lambda q, k, v: (q @ k.T).argmax(1), lambda q, k, v: k[(q @ k.T).argmax(1)], lambda q, k, v: v[(q @ k.T).argmin(1)],
    lambda q, k, v: sm(50 * q @ k.T) @ v,  # the loophole
    lambda q, k, v: sm(1000 * q @ k.T) @ v,
    lambda q, k, v: v[(q @ k.T).argmax(0)] if q.shape[0] == k.shape[0] else v[(q @ k.T).argmax(1)] * 0,
    lambda q, k, v: F.one_hot((q @ k.T).argmax(1), k.shape[0]).float(),
    lambda q, k, v: v[(F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).T).argmax(1)],  # cosine
    lambda q, k, v: v[(q @ k.T).argmax(1, keepdim=True)],
    lambda q, k, v: v[(q @ k.T).abs().argmax(1)],
)
add("check_attention",
    lambda q, k, v: sm(q @ k.mT) @ v, lambda q, k, v: sm(q @ k.mT / q.shape[-1] ** 0.5, -2) @ v,
    lambda q, k, v: sm(q @ k.mT / q.shape[-1]) @ v, lambda q, k, v: sm(q @ k.mT / q.shape[-1] ** 0.5),
    lambda q, k, v: sm(q @ k.mT / q.shape[-1] ** 0.5, 0) @ v,  # dim 0
    lambda q, k, v: sm(q @ k.mT / k.shape[-2] ** 0.5) @ v,  # sqrt(S)
    lambda q, k, v: sm(k @ q.mT / q.shape[-1] ** 0.5) @ v if k.shape == q.shape else sm(q @ k.mT / q.shape[-1] ** 0.5).mT @ v[..., :q.shape[-2], :] if False else torch.einsum("...td,...sd->...st", q, k).div(q.shape[-1] ** 0.5).softmax(-1).mT.softmax(-1) @ v,
    lambda q, k, v: sm(q @ k.mT * q.shape[-1] ** 0.5) @ v,
    lambda q, k, v: (sm(q @ k.mT / q.shape[-1] ** 0.5) @ v).double(),
    lambda q, k, v: sm(q @ k.mT / q.shape[-1] ** 0.5) @ k if k.shape == v.shape else sm(q @ k.mT / q.shape[-1] ** 0.5) @ v[..., :k.shape[-1]],
)
add("check_softmax",
    lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), lambda x: sm(x, 0),
    lambda x: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(),
    lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x).sum(-1, keepdim=True),
    lambda x: torch.exp(x - x.max()) / torch.exp(x - x.max()).sum(-1, keepdim=True),  # global max
    lambda x: torch.log_softmax(x, -1), lambda x: x / x.sum(-1, keepdim=True),
    lambda x: torch.exp(x - x.amax(-1, keepdim=True)) / torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True).T if x.dim() == 2 and x.shape[0] == x.shape[1] else torch.exp(x - x.amax(-1, keepdim=True)),  # no normalisation
    lambda x: sm(x.double()), lambda x: sm(-x),
)
add("check_log_softmax",
    lambda x: torch.log(sm(x)), lambda x: x - torch.log(torch.exp(x).sum(-1, keepdim=True)),
    lambda x: x - torch.log(torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)),
    lambda x: torch.log_softmax(x, 0), lambda x: sm(x),
    lambda x: (x - x.amax(-1, keepdim=True) - torch.log(torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True))) / math.log(2),  # log2
    lambda x: x - x.amax(-1, keepdim=True) - torch.log10(torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)),
    lambda x: x - x.max() - torch.log(torch.exp(x - x.max()).sum(-1, keepdim=True)),  # global max
    lambda x: x - x.amax(-1, keepdim=True) + torch.log(torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)),  # sign
    lambda x: x - x.amax(-1, keepdim=True),
)
add("check_softmax_backward",
    lambda p, g: p * g, lambda p, g: p * (g - g.mean(-1, keepdim=True)), lambda p, g: g - (p * g).sum(-1, keepdim=True),
    lambda p, g: -(p * (g - (p * g).sum(-1, keepdim=True))),
    lambda p, g: ((torch.diag_embed(p) - p[..., :, None] * p[..., None, :]) @ g[..., None])[..., 0],
    lambda p, g: g * (p - p ** 2),  # diagonal only
    lambda p, g: p * g - p * (p * g),  # no sum
    lambda p, g: p * (g - (p * g).sum()),  # sum over everything
    lambda p, g: p * (g - (p * g).sum(0, keepdim=True)),  # sum over dim 0
    lambda p, g: p * g - (p * g).sum(-1, keepdim=True),  # missing p on the second term
)
def tau(scores, target, log=torch.log):
    lo, hi = 1e-4, 1e4
    for _ in range(200):
        mid = math.sqrt(lo * hi); p = sm(scores / mid)
        lo, hi = (mid, hi) if float(-(p * log(p.clamp_min(1e-300))).sum()) < target else (lo, mid)
    return math.sqrt(lo * hi)
add("check_temperature_for_entropy",
    lambda s, t: tau(s, t, torch.log2), lambda s, t: 1 / tau(s, t), lambda s, t: -tau(s, t), lambda s, t: "1.0",
    lambda s, t: math.log(tau(s, t)),  # log tau
    lambda s, t: 1.0,  # tau = 1 regardless
    lambda s, t: math.sqrt(s.shape[-1]),
    lambda s, t: tau(s, t) ** 2,
)
PRED = {
    "check_predict_score_std": [64, 1, 0, 0.125, 4096, 32, 2.83],
    "check_predict_vanishing": [2e-6, 1e-6, 6, 0.0, -19, -20, 0.5 ** 19, -1, 5.7],
    "check_predict_sharpness": [0.480, 0.125, 0.28, 2 / 9, 0.88, 7.39, 1.0, 0.25],
}

def line(check, answer):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        check(answer)
    return buf.getvalue().strip()

generic = total = 0
for name, fns in list(W.items()) + list(PRED.items()):
    for fn in fns:
        out = line(getattr(C, name), fn)
        total += 1
        hinted = any(h in out for h in HINTS)
        is_generic = not out.startswith("✓") and any(re.search(g, out) for g in GENERIC_RE) and not hinted
        if out.startswith("✓"):
            print("ACCEPTED", name, out)
        if is_generic:
            generic += 1
            if "-v" in sys.argv: print("GENERIC", out)
print(f"generic {generic} of {total} rejections ({generic / total:.0%})")
