"""Exercise checks of lesson 07: the transformer block (each one prints a single line and returns True or False)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers.checks._core import Case, CheckResult, _clone, compare, run_check

__all__ = ["check_rms_norm", "check_feed_forward_gelu", "check_deepnorm_sublayer", "check_transformer_params"]


def _known_bug(name, fn, cases, bugs) -> bool:
    """Print a pointed hint and return True when ``fn`` reproduces one of the typical ``bugs`` on every case."""
    for description, bug_fn in bugs.items():
        try:
            hits = all(
                compare(fn(*_clone(c.args), **_clone(c.kwargs)), bug_fn(*_clone(c.args), **_clone(c.kwargs))) is None
                for c in cases)
        except Exception:  # the learner's own error is reported by run_check
            return False
        if hits:
            print(f"✗ {name}: {description}")
            return True
    return False


def _hinted(name, fn, reference, cases, bugs, **kwargs) -> CheckResult:
    if callable(fn) and _probe(fn, cases[0]) is not None and _known_bug(name, fn, cases, bugs):
        return CheckResult(False)
    return run_check(name, fn, reference, cases, **kwargs)


def _probe(fn, case):
    try:
        return fn(*_clone(case.args), **_clone(case.kwargs))
    except Exception:
        return None


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
    bugs = {
        "you subtract the mean: that is LayerNorm; RMSNorm only divides by the root mean square":
        lambda x, gain, eps=1e-6: gain * (x - x.mean(-1, keepdim=True))
        / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps),
        "you average over the wrong axis: the root mean square is taken over the last axis "
        "(the C features of one token)": lambda x, gain, eps=1e-6: gain * x / torch.sqrt(
            x.pow(2).mean(0, keepdim=True) + eps),
    }
    return _hinted("rms_norm", fn, _rms_norm, cases, bugs)


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
    bugs = {"you used ReLU; the exercise asks for GELU (F.gelu)":
            lambda x, w1, b1, w2, b2: F.relu(x @ w1.T + b1) @ w2.T + b2,
            "the activation is missing: without it the two linear layers collapse into one linear map":
            lambda x, w1, b1, w2, b2: (x @ w1.T + b1) @ w2.T + b2,
            "the GELU is applied after the second layer; it belongs between the two layers":
            lambda x, w1, b1, w2, b2: F.gelu((x @ w1.T + b1) @ w2.T + b2),
            "you used the tanh approximation of GELU; use the exact one, F.gelu(h) (approximate='none')":
            lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T + b1, approximate="tanh") @ w2.T + b2}
    return _hinted("feed_forward_gelu", fn, _feed_forward_gelu, cases, bugs)


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
    bugs = {"alpha scales the sub-layer's output; DeepNorm up-weights the residual x: norm(alpha * x + sublayer(x))":
            lambda x, sublayer, norm, alpha: norm(x + alpha * sublayer(x)),
            "alpha is ignored: this is plain Post-LN, norm(x + sublayer(x))":
            lambda x, sublayer, norm, alpha: norm(x + sublayer(x)),
            "the LayerNorm is inside the branch (Pre-LN style); DeepNorm is Post-LN: norm after the sum":
            lambda x, sublayer, norm, alpha: alpha * x + sublayer(norm(x))}
    with torch.no_grad():
        return _hinted("deepnorm_sublayer", fn, _deepnorm, cases, bugs)


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
    if not callable(fn):
        return run_check(name, fn, _transformer_params, cases)
    C = lambda d, f: 4 * (d * d + d) + 2 * d * f + f + d  # noqa: E731  (attention + FFN)
    bugs = {"the two final LayerNorms (one after each stack, 2 * d_model numbers each) are missing":
            lambda d, f, n, v: _transformer_params(d, f, n, v) - 4 * d,
            "the embedding is counted three times; the paper shares one matrix between both embeddings "
            "and the output layer": lambda d, f, n, v: _transformer_params(d, f, n, v) + 2 * v * d,
            "the embeddings are missing: add one vocab_size x d_model matrix":
            lambda d, f, n, v: _transformer_params(d, f, n, v) - v * d,
            "the decoder layers are counted like encoder layers: each has a second attention and a third LayerNorm":
            lambda d, f, n, v: n * 2 * (C(d, f) + 4 * d) + 4 * d + v * d}
    return _hinted(name, lambda *a: None if fn(*a) is None else int(fn(*a)), _transformer_params, cases, bugs)
