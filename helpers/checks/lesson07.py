"""Exercise checks of lesson 07: the transformer block (each one prints a single line and returns True or False)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention
from helpers.checks._core import Bug, Case, CheckResult, check, first_output
from helpers.positional import apply_rotary, rotary_angles

__all__ = ["check_rms_norm", "check_feed_forward_gelu", "check_deepnorm_sublayer", "check_rope_attention",
           "check_swiglu"]


# --- 1. RMSNorm ------------------------------------------------------------------------------------

def _rms_norm(x, gain, eps=1e-6):
    rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    return gain * x / rms  # (..., C)


def check_rms_norm(fn) -> CheckResult:
    """Check ``rms_norm(x (..., C), gain (C,), eps) -> (..., C)``, Zhang & Sennrich 2019 (lesson 07)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 5, 8, generator=g) * 3 + 1
    cases = [Case("x (2, 5, 8) with gain 1", (x, torch.ones(8))),
             Case("x (2, 5, 8) with a random gain", (x, torch.randn(8, generator=g))),
             Case("x (3, 16) with eps=0.5", (torch.randn(3, 16, generator=g), torch.ones(16)), {"eps": 0.5})]
    bugs = [
        Bug("you subtract the mean: that is LayerNorm; RMSNorm only divides by the root mean square",
        lambda x, gain, eps=1e-6: gain * (x - x.mean(-1, keepdim=True))
        / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)),
        Bug("you average over the wrong axis: the root mean square is taken over the last axis "
            "(the C features of one token)", lambda x, gain, eps=1e-6: gain * x / torch.sqrt(
                x.pow(2).mean(0, keepdim=True) + eps)),
        Bug("eps goes inside the square root, sqrt(mean(x^2) + eps), not added to the root",
            lambda x, gain, eps=1e-6: gain * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps)),
        *[Bug("that divides by the L2 norm, sqrt(sum(x^2)); the root mean square averages the squares, "
              "sqrt(mean(x^2) + eps), which is the L2 norm / sqrt(C)", l2) for l2 in (
            lambda x, gain, eps=1e-6: gain * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps),
            lambda x, gain, eps=1e-6: gain * x / x.norm(dim=-1, keepdim=True),
            lambda x, gain, eps=1e-6: gain * x / (x.norm(dim=-1, keepdim=True) + eps))],
        Bug("the gain is missing: multiply the normalised x by gain, one factor per feature",
            lambda x, gain, eps=1e-6: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)),
        Bug("the gain multiplies the normalised x; you added it", lambda x, gain, eps=1e-6: gain + x / torch.sqrt(
            x.pow(2).mean(-1, keepdim=True) + eps)),
        Bug("eps is missing: sqrt(mean(x^2) + eps) (it keeps an all-zero row from dividing by 0)",
            lambda x, gain, eps=1e-6: gain * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True))),
        Bug("the square root is missing: divide by sqrt(mean(x^2) + eps), the ROOT mean square",
            lambda x, gain, eps=1e-6: gain * x / (x.pow(2).mean(-1, keepdim=True) + eps)),
        Bug("x.var() subtracts the mean before squaring (and divides by C - 1): RMSNorm uses the plain mean of "
            "the squares, x.pow(2).mean(-1, keepdim=True)",
            lambda x, gain, eps=1e-6: gain * x / torch.sqrt(x.var(-1, keepdim=True) + eps)),
        Bug("x.var() subtracts the mean before squaring: RMSNorm uses the plain mean of the squares, "
            "x.pow(2).mean(-1, keepdim=True)",
            lambda x, gain, eps=1e-6: gain * x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)),
    ]
    return check("rms_norm", fn, _rms_norm, cases, bugs=bugs)


# --- 2. a feed-forward network with GELU ---------------------------------------------------------

def _feed_forward_gelu(x, w1, b1, w2, b2):
    return F.gelu(x @ w1.T + b1) @ w2.T + b2  # (B, T, C) -> (B, T, d_ff) -> (B, T, C)


def check_feed_forward_gelu(fn) -> CheckResult:
    """Check ``feed_forward_gelu(x (B, T, C), w1 (d_ff, C), b1, w2 (C, d_ff), b2) -> (B, T, C)`` (lesson 07)."""
    g = torch.Generator().manual_seed(3)

    def case(name, B, T, C, d_ff):
        return Case(name, (torch.randn(B, T, C, generator=g), torch.randn(d_ff, C, generator=g),
                           torch.randn(d_ff, generator=g), torch.randn(C, d_ff, generator=g),
                           torch.randn(C, generator=g)))

    cases = [case("x (2, 3, 4), d_ff 8", 2, 3, 4, 8), case("x (1, 6, 8), d_ff 32", 1, 6, 8, 32)]
    bugs = [Bug("you used ReLU; the exercise asks for GELU (F.gelu)",
            lambda x, w1, b1, w2, b2: F.relu(x @ w1.T + b1) @ w2.T + b2),
            Bug("the activation is missing: without it the two linear layers collapse into one linear map",
            lambda x, w1, b1, w2, b2: (x @ w1.T + b1) @ w2.T + b2),
            Bug("the GELU is applied after the second layer; it belongs between the two layers",
            lambda x, w1, b1, w2, b2: F.gelu((x @ w1.T + b1) @ w2.T + b2)),
            Bug("you used the tanh approximation of GELU; use the exact one, F.gelu(h) (approximate='none')",
            lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T + b1, approximate="tanh") @ w2.T + b2),
            Bug("the first bias is missing: GELU(x W1^T + b1)", lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T) @ w2.T + b2),
            Bug("the second bias is missing: ... @ w2.T + b2", lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T + b1) @ w2.T),
            Bug("you added the residual x: the block adds it, the feed-forward network returns only its own output",
            lambda x, w1, b1, w2, b2: x + F.gelu(x @ w1.T + b1) @ w2.T + b2),
            Bug("you used SiLU; the exercise asks for GELU (F.gelu)",
            lambda x, w1, b1, w2, b2: F.silu(x @ w1.T + b1) @ w2.T + b2)]
    return check("feed_forward_gelu", fn, _feed_forward_gelu, cases, bugs=bugs)


# --- 3. a DeepNorm sub-layer ---------------------------------------------------------------------

def _deepnorm(x, sublayer, norm, alpha):
    return norm(alpha * x + sublayer(x))  # (B, T, C)


def check_deepnorm_sublayer(fn) -> CheckResult:
    """Check ``deepnorm_sublayer(x, sublayer, norm, alpha) = norm(alpha * x + sublayer(x))`` (lesson 07)."""
    g = torch.Generator().manual_seed(5)
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(5)
    linear, norm = nn.Linear(6, 6), nn.LayerNorm(6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    torch.random.set_rng_state(torch_state)
    cases = [Case("x (2, 4, 6), a linear sub-layer, alpha 2", (torch.randn(2, 4, 6, generator=g), linear, norm, 2.0)),
             Case("x (1, 3, 6), tanh as the sub-layer, alpha 3.5",
                  (torch.randn(1, 3, 6, generator=g) + 1, torch.tanh, norm, 3.5))]
    bugs = [Bug("alpha scales the sub-layer's output; DeepNorm up-weights the residual x: "
                "norm(alpha * x + sublayer(x))",
            lambda x, sublayer, norm, alpha: norm(x + alpha * sublayer(x))),
            Bug("alpha is ignored: this is plain Post-LN, norm(x + sublayer(x))",
            lambda x, sublayer, norm, alpha: norm(x + sublayer(x))),
            Bug("the LayerNorm is inside the branch (Pre-LN style); DeepNorm is Post-LN: norm after the sum",
            lambda x, sublayer, norm, alpha: alpha * x + sublayer(norm(x))),
            Bug("the LayerNorm comes after the sum: norm(alpha * x + sublayer(x)), not norm(alpha * x) + sublayer(x)",
            lambda x, sublayer, norm, alpha: norm(alpha * x) + sublayer(x)),
            Bug("alpha scales the residual x, not the sub-layer's input: norm(alpha * x + sublayer(x))",
            lambda x, sublayer, norm, alpha: norm(x + sublayer(alpha * x))),
            Bug("there is no second residual around the norm: DeepNorm returns norm(alpha * x + sublayer(x))",
            lambda x, sublayer, norm, alpha: x + norm(alpha * x + sublayer(x))),
            Bug("alpha multiplies x inside the norm, not the normalised output: norm(alpha * x + sublayer(x))",
            lambda x, sublayer, norm, alpha: alpha * norm(x + sublayer(x)))]
    with torch.no_grad():
        return check("deepnorm_sublayer", fn, _deepnorm, cases, bugs=bugs)


# --- 4. RoPE inside multi-head attention ---------------------------------------------------------

def _rope_attention(x, mha, rotate=(True, True, False), before_split=False, project_out=True, scale=None,
                    causal=False, merge_transpose=True, softmax_dim=-1):
    """Self-attention of ``mha`` with RoPE on each head's queries and keys; the keywords reproduce slips."""
    B, T, C = x.shape
    H, D = mha.n_heads, C // mha.n_heads

    def split(t):
        return t.view(B, T, H, D).transpose(1, 2)  # (B, T, C) -> (B, H, T, D)

    projected = [mha.w_q(x), mha.w_k(x), mha.w_v(x)]  # 3 x (B, T, C)
    if before_split:
        projected = [apply_rotary(t) if r else t for t, r in zip(projected, rotate, strict=True)]
        q, k, v = (split(t) for t in projected)
    else:
        q, k, v = (apply_rotary(split(t)) if r else split(t)
                   for t, r in zip(projected, rotate, strict=True))  # (B, H, T, D), rotated by position
    scores = q @ k.transpose(-2, -1) * (D ** -0.5 if scale is None else scale)  # (B, H, T, T)
    if causal:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    out = scores.softmax(dim=softmax_dim) @ v  # (B, H, T, D)
    out = out.transpose(1, 2).reshape(B, T, C) if merge_transpose else out.reshape(B, T, C)  # -> (B, T, C)
    return mha.w_o(out) if project_out else out


def _half_split_rope(x, mha):
    """RoPE with pairs (i, i + D/2) (exercise 3 of lesson 06) instead of apply_rotary's (2i, 2i + 1)."""
    B, T, C = x.shape
    H, D = mha.n_heads, C // mha.n_heads
    angle = rotary_angles(T, D)  # (T, D/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)

    def rope(t):
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1)

    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (mha.w_q(x), mha.w_k(x), mha.w_v(x)))
    out = scaled_dot_product_attention(rope(q), rope(k), v)[0]
    return mha.w_o(out.transpose(1, 2).reshape(B, T, C))


def check_rope_attention(fn) -> CheckResult:
    """Check ``rope_attention(x (B, T, C), mha) -> (B, T, C)``: RoPE on each head's q and k (lesson 07)."""
    with torch.random.fork_rng(devices=[]):  # the same modules every time, without touching the learner's seed
        torch.manual_seed(7)
        small, wide = MultiHeadAttention(8, 2), MultiHeadAttention(12, 3)
    g = torch.Generator().manual_seed(7)
    cases = [Case("x (2, 5, 8), 2 heads of width 4", (torch.randn(2, 5, 8, generator=g), small)),
             Case("x (1, 9, 12), 3 heads of width 4", (torch.randn(1, 9, 12, generator=g), wide)),
             Case("x (1, 6, 8), 2 heads", (torch.randn(1, 6, 8, generator=g) * 3, small))]
    bugs = [Bug("no rotation at all: apply_rotary to each head's queries and keys before the scores",
                lambda x, m: _rope_attention(x, m, rotate=(False, False, False))),
            Bug("you rotated the values too: rotate only the queries and keys, since position only "
                "has to reach the scores", lambda x, m: _rope_attention(x, m, rotate=(True, True, True))),
            Bug("only the queries are rotated: rotate the keys as well, so that each score depends on "
                "the distance between query and key", lambda x, m: _rope_attention(x, m, rotate=(True, False, False))),
            Bug("only the keys are rotated: rotate the queries as well, so that each score depends on "
                "the distance between query and key", lambda x, m: _rope_attention(x, m, rotate=(False, True, False))),
            Bug("you rotated the (B, T, C) projections before splitting the heads: the frequencies then "
                "follow C; split into (B, H, T, D) first and rotate each head's D features",
                lambda x, m: _rope_attention(x, m, before_split=True)),
            Bug("the output projection is missing: finish with mha.w_o after merging the heads",
                lambda x, m: _rope_attention(x, m, project_out=False)),
            Bug("the scores are not scaled: divide q @ k^T by sqrt(D), the head width, before the softmax",
                lambda x, m: _rope_attention(x, m, scale=1.0)),
            Bug("the scale uses the model width: divide the scores by sqrt(D), the head width D = C / H, "
                "not by sqrt(C)", lambda x, m: _rope_attention(x, m, scale=x.shape[-1] ** -0.5)),
            Bug("you added a causal mask: this exercise is full self-attention, every query sees every key",
                lambda x, m: _rope_attention(x, m, causal=True)),
            Bug("merging the heads needs transpose(1, 2) before reshape(B, T, C): a plain reshape of "
                "(B, H, T, D) mixes tokens", lambda x, m: _rope_attention(x, m, merge_transpose=False)),
            Bug("the softmax runs over the queries (dim -2): each query's weights over the keys must sum to 1",
                lambda x, m: _rope_attention(x, m, softmax_dim=-2)),
            Bug("that pairs feature i with i + D/2 (exercise 3 of lesson 06); apply_rotary pairs "
                "features (2i, 2i + 1): use apply_rotary", _half_split_rope)]
    with torch.no_grad():
        return check("rope_attention", fn, _rope_attention, cases, bugs=bugs, adapt=first_output)


# --- 5. a SwiGLU feed-forward network ------------------------------------------------------------

def _swiglu(x, w_gate, w_up, w_down, act=F.silu, gate_on_up=False):
    """Shazeer 2020: (act(x W_gate^T) * (x W_up^T)) W_down^T; the keywords reproduce typical slips."""
    gate, up = x @ w_gate.T, x @ w_up.T  # (B, T, C) -> (B, T, d_ff) each
    if gate_on_up:
        gate, up = up, gate
    return (act(gate) * up) @ w_down.T  # (B, T, d_ff) -> (B, T, C)


def check_swiglu(fn) -> CheckResult:
    """Check ``swiglu(x (B, T, C), w_gate (d_ff, C), w_up (d_ff, C), w_down (C, d_ff)) -> (B, T, C)`` (lesson 07)."""
    g = torch.Generator().manual_seed(9)

    def case(name, B, T, C, d_ff, scale=1.0):
        return Case(name, (torch.randn(B, T, C, generator=g) * scale, torch.randn(d_ff, C, generator=g),
                           torch.randn(d_ff, C, generator=g), torch.randn(C, d_ff, generator=g)))

    cases = [case("x (2, 3, 4), d_ff 6", 2, 3, 4, 6), case("x (1, 5, 8), d_ff 12", 1, 5, 8, 12),
             case("x (1, 2, 4) of large values, d_ff 4", 1, 2, 4, 4, scale=4.0)]
    bugs = [Bug("you used sigmoid(x W_gate^T) as the gate: SiLU is x * sigmoid(x), F.silu",
                lambda x, a, b, c: _swiglu(x, a, b, c, act=torch.sigmoid)),
            Bug("SiLU is applied to the up branch: apply it to x W_gate^T and multiply by x W_up^T",
                lambda x, a, b, c: _swiglu(x, a, b, c, gate_on_up=True)),
            Bug("you used GELU; SwiGLU gates with SiLU (F.silu), GeGLU with GELU",
                lambda x, a, b, c: _swiglu(x, a, b, c, act=F.gelu)),
            Bug("the gate's activation is missing: (x W_gate^T) * (x W_up^T) is a plain bilinear layer; use F.silu",
                lambda x, a, b, c: _swiglu(x, a, b, c, act=lambda t: t)),
            Bug("the up branch is missing: SwiGLU multiplies F.silu(x W_gate^T) by x W_up^T before w_down",
                lambda x, a, b, c: F.silu(x @ a.T) @ c.T),
            Bug("SiLU is applied after the product: gate first, F.silu(x W_gate^T), then multiply by x W_up^T",
                lambda x, a, b, c: F.silu((x @ a.T) * (x @ b.T)) @ c.T),
            Bug("you used ReLU; SwiGLU gates with SiLU (F.silu), ReGLU with ReLU",
                lambda x, a, b, c: _swiglu(x, a, b, c, act=F.relu)),
            Bug("you added the residual x: the block adds it, the feed-forward network returns only its own output",
                lambda x, a, b, c: x + _swiglu(x, a, b, c)),
            Bug("the down-projection is missing: finish with @ w_down.T, back to (B, T, C)",
                lambda x, a, b, c: F.silu(x @ a.T) * (x @ b.T))]
    return check("swiglu", fn, _swiglu, cases, bugs=bugs)
