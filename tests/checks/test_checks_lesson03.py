"""Lesson 03's checks: right answers pass with the stored line, stubs say so, wrong answers are named."""

import math

import hypothesis.strategies as st
import torch
from hypothesis import given

from helpers.attention import softmax
from helpers.checks import (
    check_log_softmax,
    check_predict_score_std,
    check_softmax,
    check_softmax_backward,
    check_temperature_for_entropy,
)
from helpers.checks.lesson03 import _softmax_backward


def test_check_log_softmax(verdict):
    def stable(x):
        m = x.amax(-1, keepdim=True)
        return x - m - torch.log(torch.exp(x - m).sum(-1, keepdim=True))
    assert verdict(check_log_softmax, stable)[0]
    ok, line = verdict(check_log_softmax, lambda x: torch.log(torch.softmax(x, -1)))
    assert not ok and "+-1e4" in line and "log(softmax(x)) is -inf" in line
    ok, line = verdict(check_log_softmax, lambda x: x - torch.log(torch.exp(x).sum(-1, keepdim=True)))
    assert not ok and "subtract the row max" in line


def test_check_softmax_backward(verdict, accepts, rejects):
    accepts(check_softmax_backward, lambda p, g: p * (g - (p * g).sum(-1, keepdim=True)),
            "✓ softmax_backward: matches the reference on all 4 cases")

    def backward(p, grad_p):  # right values, but it builds the (S, S) Jacobian the exercise forbids
        J = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (..., S, S)
        return (J @ grad_p.unsqueeze(-1)).squeeze(-1)
    rejects(check_softmax_backward, backward, "the (S, S) Jacobian")

    def via_autograd(p, grad_p):  # right values through torch.autograd.functional.jacobian: (S, S) again
        J = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, -1), torch.log(p.clamp_min(1e-30)))
        return J.mT @ grad_p if p.dim() == 1 else p * (grad_p - (p * grad_p).sum(-1, keepdim=True))
    rejects(check_softmax_backward, via_autograd, "✗ softmax_backward")

    def in_place(p, g):
        g -= (p * g).sum(-1, keepdim=True)
        return p * g
    rejects(check_softmax_backward, in_place, "in place")
    bugs = {"term -p (p . grad_p)": lambda p, g: p * g,
            "plain mean": lambda p, g: p * (g - g.mean(-1, keepdim=True)),
            "lacks the factor p": lambda p, g: g - (p * g).sum(-1, keepdim=True),
            "opposite sign": lambda p, g: -backward(p, g)}
    for hint, buggy in bugs.items():
        ok, line = verdict(check_softmax_backward, buggy)
        assert not ok and hint in line, line


def bisect_temperature(scores, target, log=torch.log):
    lo, hi = math.log(1e-4), math.log(1e4)  # bisect on log tau: entropy grows with tau
    for _ in range(60):
        mid = (lo + hi) / 2
        p = torch.softmax(scores / math.exp(mid), -1)
        if -(p * log(p.clamp_min(1e-300))).sum() < target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def test_check_temperature_for_entropy(verdict):
    assert verdict(check_temperature_for_entropy, bisect_temperature)[0]
    ok, line = verdict(check_temperature_for_entropy, lambda s, t: 1.0)
    assert not ok and "target entropy 1.0" in line
    assert "your tau = 1 gives entropy 0.923483 nats; the target is 1 nats" in line  # tau and entropy told apart
    ok, line = verdict(check_temperature_for_entropy, lambda s, t: bisect_temperature(s, t, torch.log2))
    assert not ok and "the entropy must be in nats (natural log)" in line  # bisected on entropy in bits
    ok, line = verdict(check_temperature_for_entropy, lambda s, t: 1 / bisect_temperature(s, t))
    assert not ok and "✗ temperature_for_entropy" in line
    ok, line = verdict(check_temperature_for_entropy, lambda s, t: -1.0)
    assert not ok and "must be positive" in line


@given(st.integers(2, 9), st.integers(0, 2**16), st.floats(0.1, 10.0))
def test_reference_softmax_backward_equals_autograd(S, seed, spread):
    """The check's reference p * (g - p.g) is the gradient autograd gets through torch.softmax."""
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(S, generator=g, dtype=torch.float64) * spread).requires_grad_()
    grad_p = torch.randn(S, generator=g, dtype=torch.float64)
    (expected,) = torch.autograd.grad(torch.softmax(s, -1), s, grad_outputs=grad_p)
    assert torch.allclose(_softmax_backward(torch.softmax(s, -1).detach(), grad_p), expected, atol=1e-12)


def test_check_softmax(accepts, rejects):
    accepts(check_softmax, lambda x: torch.softmax(x, dim=-1), "✓ softmax: matches the reference on all 4 cases")
    accepts(check_softmax, lambda x: softmax(x, dim=-1))
    rejects(check_softmax, lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), "+-1e4")
    rejects(check_softmax, lambda x: torch.softmax(x, dim=0), "first dimension")
    rejects(check_softmax, lambda x: torch.softmax(x, dim=-1).numpy(), "return a torch.Tensor")

    def in_place(x):
        x -= x.amax(-1, keepdim=True)
        return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
    rejects(check_softmax, in_place, "in place")


def test_more_log_softmax_wrong_answers(rejects):
    rejects(check_log_softmax, lambda x: torch.log_softmax(x, dim=0), "✗ log_softmax")
    rejects(check_log_softmax, lambda x: torch.log_softmax(x.double(), dim=-1), "return dtype torch.float32")
    rejects(check_log_softmax, lambda x: x - x.amax(-1, keepdim=True), "✗ log_softmax")


def test_predict_score_std(verdict):
    assert not verdict(check_predict_score_std, None)[0]
    ok, line = verdict(check_predict_score_std, math.sqrt(64))
    assert ok and line.startswith("✓ predict_score_std: you predicted 8; the measured")
    assert not verdict(check_predict_score_std, 1.0)[0]  # "about 1, like the entries"
    assert not verdict(check_predict_score_std, 64.0)[0]  # the variance, not the standard deviation
    for slip, words in ((64, "is the variance"), (1, "after the division by sqrt(d_k)"), (0.125, "scaling factor"),
                        (4096, "squares the width"), (32, "halves the width"), (2.83, "square root twice"),
                        (0, "the mean of q . k"), (-8, "never negative")):
        ok, line = verdict(check_predict_score_std, slip)
        assert not ok and words in line, line
