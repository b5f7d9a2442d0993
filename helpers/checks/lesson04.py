"""Exercise checks of lesson 04, multi-head attention (each prints a single line, returns True/False)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention
from helpers.checks._core import Bug, Case, CheckResult, check, first_output, randn, torch_calls
from helpers.checks._slips import check_prediction_with_slips

__all__ = ["check_mha_param_count", "check_split_qkv", "check_grouped_query_attention", "check_pattern_mass",
           "check_predict_weights_ratio"]


def mha_param_count_reference(d_model: int, n_heads: int, bias: bool = True) -> int:
    """Parameters of multi-head attention: four C x C projections (+ four biases of C) (lesson 04)."""
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def check_mha_param_count(fn) -> CheckResult:
    """Check ``mha_param_count(d_model, n_heads, bias) -> int`` (lesson 04, exercise 1)."""
    cases = [
        Case("d_model=12, n_heads=3, bias=True", (12, 3, True)),
        Case("d_model=512, n_heads=8, bias=True", (512, 8, True)),
        Case("d_model=64, n_heads=4, bias=False", (64, 4, False)),
        Case("d_model=64, n_heads=1, bias=False", (64, 1, False)),
    ]

    bugs = [Bug("the biases are counted although bias=False: add the 4 * d_model biases only when bias=True",
                lambda d, h, b: 4 * d * d + 4 * d),
            Bug("the biases are missing: with bias=True each of the four projections has d_model of them",
                lambda d, h, b: 4 * d * d),
            Bug("the count depends on n_heads: H heads of width D = C / H share the same C x C projections",
                lambda d, h, b: h * mha_param_count_reference(d, h, b)),
            Bug("the output projection is missing: there are four C x C matrices (q, k, v, out)",
                lambda d, h, b: 3 * d * d + (3 * d if b else 0)),
            Bug("you counted one head's slices (C x D each): the H slices of a projection together make one "
                "C x C matrix, so the heads share 4 C x C weights",
                lambda d, h, b: 4 * d * (d // h) + (4 * d if b else 0)),
            Bug("each bias is a vector of d_model numbers, one per output feature, not a single number",
                lambda d, h, b: 4 * d * d + (4 if b else 0)),
            Bug("only one bias vector: each of the four projections has its own bias of d_model numbers",
                lambda d, h, b: 4 * d * d + (d if b else 0)),
            Bug("the biases do not depend on n_heads: each projection has one bias of d_model numbers, "
                "which the heads share out like its weights", lambda d, h, b: 4 * d * d + (4 * d * h if b else 0))]

    def formula_only(fn):  # "from the formula, without building it": no torch call at all
        used = torch_calls(fn, 64, 4, True)
        if used:
            return False, ("the count is right, but your function calls torch (" + ", ".join(
                sorted(n for n in used if not n.startswith("_"))[:3]) + "): compute it from the formula, without "
                "building the module")
        return True, ""

    return check("mha_param_count", fn, mha_param_count_reference, cases, bugs=bugs, then=formula_only)


def split_qkv_reference(x, in_proj_weight, in_proj_bias, n_heads):
    """Project x (B, T, C) with a stacked (3C, C) weight, split into q, k, v, each (B, H, T, D) (lesson 04)."""
    B, T, C = x.shape
    qkv = F.linear(x, in_proj_weight, in_proj_bias)  # (B, T, C) -> (B, T, 3C)
    q, k, v = qkv.split(C, dim=-1)  # 3 x (B, T, C)
    return tuple(t.view(B, T, n_heads, C // n_heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)


def check_split_qkv(fn) -> CheckResult:
    """Check ``split_qkv(x, in_proj_weight, in_proj_bias, n_heads) -> (q, k, v)`` (lesson 04, exercise 2)."""
    g = torch.Generator().manual_seed(4)
    cases = []
    for B, T, C, H in [(2, 5, 12, 3), (1, 4, 8, 2), (3, 2, 16, 4)]:
        cases.append(Case(f"x ({B}, {T}, {C}), {H} heads", (randn(g, B, T, C), randn(g, 3 * C, C),
                                                            randn(g, 3 * C), H)))
    def no_transpose(x, w, b, h):
        B, T, C = x.shape
        return tuple(t.reshape(B, h, T, C // h) for t in F.linear(x, w, b).split(C, dim=-1))

    def heads_first(x, w, b, h):  # GPT-style (B, T, H, 3D) chunking of a weight stacked as [W_Q; W_K; W_V]
        B, T, C = x.shape
        qkv = F.linear(x, w, b).view(B, T, h, 3 * (C // h)).transpose(1, 2)  # (B, H, T, 3D)
        return tuple(qkv.chunk(3, dim=-1))

    def permuted(order):
        return lambda x, w, b, h: tuple(t.permute(*order) for t in split_qkv_reference(x, w, b, h))

    def no_head_transpose(x, w, b, h):
        B, T, C = x.shape
        return tuple(t.view(B, T, h, C // h) for t in F.linear(x, w, b).split(C, dim=-1))

    def head_width_first(x, w, b, h):  # view(B, T, D, H): H and D swapped
        B, T, C = x.shape
        return tuple(t.view(B, T, C // h, h).transpose(1, 2) for t in F.linear(x, w, b).split(C, -1))

    orders = [(1, 0, 2), (1, 2, 0), (0, 2, 1), (2, 0, 1), (2, 1, 0)]  # every wrong order of (q, k, v)
    bugs = [Bug("the head axis must come before time: after view(B, T, H, D), transpose(1, 2) gives (B, H, T, D)",
                no_head_transpose),
            Bug("each result is (B, H, D, T): the last two axes are swapped; return (B, H, T, D)",
                permuted((0, 1, 3, 2))),
            Bug("H and D are swapped: view each third as (B, T, H, D), so that each head owns D consecutive "
                "features", head_width_first),
            *[Bug("q, k and v come out in the wrong order: the stacked weight holds W_Q, then W_K, then W_V, so "
                  "the first third of the projection is q", lambda x, w, b, h, o=o: tuple(
                      split_qkv_reference(x, w, b, h)[i] for i in o)) for o in orders],
            Bug("q, k, v must be split off the last axis first ((B, T, 3C) -> 3 x (B, T, C)), then "
                "viewed as (B, T, H, D) and transposed; reshaping straight to (B, H, T, D) mixes tokens",
                no_transpose),
            Bug("the bias is missing: project with F.linear(x, in_proj_weight, in_proj_bias)",
                lambda x, w, b, h: split_qkv_reference(x, w, None, h)),
            Bug("you split the heads before cutting q, k, v: the last axis of (B, T, 3C) holds all C query "
                "features, then all keys, then all values; cut with split(C, dim=-1) first, then split the heads",
                heads_first)]
    return check("split_qkv", fn, split_qkv_reference, cases, bugs=bugs)


def grouped_query_attention_reference(q, k, v):
    """Attention where G key/value heads serve H query heads, H // G each, in order (lesson 04)."""
    H, G = q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // G, dim=1)  # (B, G, S, D) -> (B, H, S, D): group g serves heads g*H/G ...
    v = v.repeat_interleave(H // G, dim=1)  # (B, G, S, D) -> (B, H, S, D)
    return scaled_dot_product_attention(q, k, v)[0]  # (B, H, T, D)


def check_grouped_query_attention(fn) -> CheckResult:
    """Check ``grouped_query_attention(q (B,H,T,D), k (B,G,S,D), v (B,G,S,D)) -> (B,H,T,D)`` (lesson 04, ex. 3)."""
    g = torch.Generator().manual_seed(5)
    cases = [
        Case("H=4 query heads sharing G=2 key/value heads", (randn(g, 2, 4, 3, 8), randn(g, 2, 2, 5, 8),
                                                              randn(g, 2, 2, 5, 8))),
        Case("H=6 query heads sharing G=3 key/value heads", (randn(g, 1, 6, 4, 4), randn(g, 1, 3, 4, 4),
                                                              randn(g, 1, 3, 4, 4))),
        Case("G=1 (multi-query attention)", (randn(g, 2, 4, 3, 8), randn(g, 2, 1, 6, 8), randn(g, 2, 1, 6, 8))),
        Case("G=H (plain multi-head attention)", (randn(g, 1, 2, 3, 4), randn(g, 1, 2, 3, 4),
                                                  randn(g, 1, 2, 3, 4))),
    ]
    def tiled(q, k, v):  # repeat() tiles the groups: head h would use group h % G
        H, G = q.shape[1], k.shape[1]
        return scaled_dot_product_attention(q, k.repeat(1, H // G, 1, 1), v.repeat(1, H // G, 1, 1))[0]

    def gqa(q, k, v, scale=None, dim=-1, weights=False):
        r = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)  # (B, H, S, D)
        scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)  # (B, H, T, S)
        w = scores.softmax(dim=dim)
        return w if weights else w @ v

    bugs = [Bug("the scores are not scaled: divide q @ k^T by sqrt(D) before the softmax", lambda q, k, v: gqa(
                q, k, v, scale=1.0)),
            Bug("the softmax runs over the queries (dim -2): each query's weights over the keys must sum to 1, "
                "softmax(dim=-1)", lambda q, k, v: gqa(q, k, v, dim=-2)),
            Bug("you returned the attention weights (B, H, T, S); return the output, weights @ v, (B, H, T, D)",
                lambda q, k, v: gqa(q, k, v, weights=True)),
            Bug("keys and values are swapped: the scores compare q with k, and the output averages v",
                lambda q, k, v: gqa(q, v, k)),
            Bug("heads are matched to groups as h % G (repeat): query head h (counting from 0) uses group "
                "h // (H / G), so consecutive heads share a group (repeat_interleave)", tiled),
            Bug("every query head uses key/value group 0: repeat each of the G groups H / G times "
                "(repeat_interleave), do not broadcast the first one",
                lambda q, k, v: scaled_dot_product_attention(q, k[:, :1], v[:, :1])[0]),
            Bug("the groups are averaged into one key/value head: keep all G, each repeated H / G times",
                lambda q, k, v: scaled_dot_product_attention(q, k.mean(1, keepdim=True), v.mean(1, keepdim=True))[0])]
    return check("grouped_query_attention", fn, grouped_query_attention_reference, cases, bugs=bugs,
                 adapt=first_output)


def pattern_mass_reference(weights, pattern):
    """Each head's mean attention mass on a (T, S) boolean pattern, over rows that have one (lesson 04)."""
    rows = pattern.any(dim=-1)  # (T,): queries for which the pattern says something
    mass = (weights * pattern).sum(dim=-1)  # (B, H, T, S) -> (B, H, T)
    return mass[..., rows].mean(dim=(0, 2))  # (B, H, T') -> (H,)


def check_pattern_mass(fn) -> CheckResult:
    """Check ``pattern_mass(weights (B, H, T, S), pattern (T, S) bool) -> (H,)`` (lesson 04, exercise 4)."""
    g = torch.Generator().manual_seed(6)
    weights = randn(g, 3, 2, 6, 6).mul(2).softmax(dim=-1)  # (B, H, T, S)
    previous = torch.ones(6, 6, dtype=torch.bool).tril(-1).triu(-1)  # s = t - 1; row 0 is empty
    first = torch.zeros(6, 6, dtype=torch.bool)
    first[:, 0] = True
    cross = randn(g, 4, 2, 3, 5).softmax(dim=-1)  # (B, H, T, S) with T != S
    two_keys = torch.zeros(3, 5, dtype=torch.bool)
    two_keys[:, [1, 3]] = True
    cases = [
        Case("pattern 'first key' (every row has one True)", (weights, first)),
        Case("pattern 'previous key' (row 0 has no True and must be left out)", (weights, previous)),
        Case("cross-attention weights (B=4, H=2, T=3, S=5), pattern 'keys 1 and 3'", (cross, two_keys)),
    ]
    bugs = [Bug("rows where the pattern has no True must be left out of the mean, not counted as 0",
                lambda w, p: (w * p).sum(dim=-1).mean(dim=(0, 2))),
            Bug("the mean runs over the heads: return one number per head, averaged over batch and queries",
                lambda w, p: (w * p).sum(dim=-1)[..., p.any(dim=-1)].mean(dim=(1, 2))),
            Bug("that is a sum over the queries and the batch: average them (mean), so a perfect head scores 1",
                lambda w, p: (w * p).sum(dim=-1)[..., p.any(dim=-1)].sum(dim=(0, 2))),
            Bug("the mass is averaged over the keys: sum it over the keys of the pattern (dim -1), then average "
                "over queries and batch", lambda w, p: (w * p).mean(dim=-1)[..., p.any(dim=-1)].mean(dim=(0, 2))),
            Bug("that is the mass OFF the pattern: multiply the weights by the pattern (True where the head "
                "should look), not by its negation",
                lambda w, p: (w * ~p).sum(dim=-1)[..., p.any(dim=-1)].mean(dim=(0, 2))),
            Bug("the pattern is transposed: it is (T, S), row t for query t, column s for key s, the same layout "
                "as the last two axes of the weights", lambda w, p: (w * p.T).sum(dim=-1)[..., p.any(dim=-1)].mean(
                    dim=(0, 2))),
            Bug("average over the queries too: you return one number per head and query, (H, T'); the answer "
                "is one per head, (H,)", lambda w, p: (w * p).sum(dim=-1)[..., p.any(dim=-1)].mean(dim=0)),
            Bug("that is one number for all heads: return one per head, averaged over batch and queries "
                "(dim=(0, 2))", lambda w, p: (w * p).sum(dim=-1)[..., p.any(dim=-1)].mean()),
            Bug("the mass is divided by the number of keys in the pattern: it is the plain sum of the weights "
                "on the pattern, so a head that looks only there scores 1", lambda w, p: ((w * p).sum(dim=-1)
                / p.sum(dim=-1).clamp_min(1))[..., p.any(dim=-1)].mean(dim=(0, 2)))]
    return check("pattern_mass", fn, pattern_mass_reference, cases, bugs=bugs)


def _weights_ratio() -> float:
    """Numbers in the attention weights of MultiHeadAttention(64, 8) over those of (64, 1), same input."""
    x = torch.randn(2, 10, 64, generator=torch.Generator().manual_seed(0))  # (B, T, C)

    def weights(n_heads):
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            return MultiHeadAttention(64, n_heads)(x, x, x)[1]  # (B, H, T, T)
    return weights(8).numel() / weights(1).numel()


def check_predict_weights_ratio(predicted) -> CheckResult:
    """Predict then measure: how many times more attention weights 8 heads produce than 1 head, C=64 (lesson 04).

    The nearest plausible wrong answers are 1 (the parameters and the arithmetic do not change with H)
    and 1/8; a margin of 0.5 tells each apart from 8.
    """
    slips = ((1.0, "the parameters and the multiplications do not change with H, but the weights do: every "
                   "head has its own (T, T) matrix of weights, so 8 heads hold 8 times as many"),
             (1 / 8, "upside down: the 8-head module holds 8 (T, T) matrices per sequence, the 1-head module one"),
             (64.0, "64 is C, the width; the weights do not depend on the width: (B, H, T, T) for H = 8 and H = 1"))
    return check_prediction_with_slips(
        "predict_weights_ratio", predicted, _weights_ratio, "ratio of attention-weight counts (8 heads / 1 head)",
        abs_tol=0.5, slips=slips, hint="the weights have shape (B, H, T, T): count them for H = 8 and for H = 1")
