"""Exercise checks of lesson 07: the transformer block (each one prints a single line and returns True or False)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers.checks._core import Bug, Case, CheckResult, check, check_prediction

__all__ = ["check_rms_norm", "check_feed_forward_gelu", "check_deepnorm_sublayer", "check_transformer_params",
           "check_predict_ffn_share"]


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
            lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T + b1, approximate="tanh") @ w2.T + b2)]
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
            lambda x, sublayer, norm, alpha: alpha * x + sublayer(norm(x)))]
    with torch.no_grad():
        return check("deepnorm_sublayer", fn, _deepnorm, cases, bugs=bugs)


# --- 4. the parameters of a whole model ----------------------------------------------------------

def _transformer_params(d_model, d_ff, n_layers, vocab_size):
    body = nn.Transformer(d_model, math.gcd(d_model, 8), n_layers, n_layers, d_ff, batch_first=True,
                          device="meta")
    return sum(p.numel() for p in body.parameters()) + vocab_size * d_model


def check_transformer_params(fn) -> CheckResult:
    """Check ``transformer_params(d_model, d_ff, n_layers, vocab_size) -> int``, tied embeddings (lesson 07)."""
    cases = [Case("d_model=512, d_ff=2048, 6 layers, vocabulary 37000 (base)", (512, 2048, 6, 37000)),
             Case("d_model=64, d_ff=256, 2 layers, vocabulary 100", (64, 256, 2, 100)),
             Case("d_model=1024, d_ff=4096, 6 layers, vocabulary 37000 (big)", (1024, 4096, 6, 37000))]
    name = "transformer_params"
    C = lambda d, f: 4 * (d * d + d) + 2 * d * f + f + d  # noqa: E731  (attention + FFN)
    bugs = [Bug("the two final LayerNorms (one after each stack, 2 * d_model numbers each) are missing",
            lambda d, f, n, v: _transformer_params(d, f, n, v) - 4 * d),
            Bug("the embedding is counted three times; the paper shares one matrix between both embeddings "
                "and the output layer", lambda d, f, n, v: _transformer_params(d, f, n, v) + 2 * v * d),
            Bug("the embeddings are missing: add one vocab_size x d_model matrix",
            lambda d, f, n, v: _transformer_params(d, f, n, v) - v * d),
            Bug("the decoder layers are counted like encoder layers: each has a second attention and a third LayerNorm",
            lambda d, f, n, v: n * 2 * (C(d, f) + 4 * d) + 4 * d + v * d)]
    return check(name, fn, _transformer_params, cases, bugs=bugs)


def _ffn_share(d_model: int = 512, d_ff: int = 4096) -> float:
    layer = nn.TransformerEncoderLayer(d_model, 8, d_ff, device="meta")
    ffn = sum(p.numel() for m in (layer.linear1, layer.linear2) for p in m.parameters())
    return ffn / sum(p.numel() for p in layer.parameters())


def check_predict_ffn_share(predicted) -> CheckResult:
    """Predict then measure: the FFN's share of an encoder layer's parameters at d_model=512, d_ff=4096 (lesson 07)."""
    return check_prediction("predict_ffn_share", predicted, _ffn_share,
                            "share of the parameters in the feed-forward network (d_ff = 8 d_model)",
                            abs_tol=0.05)
