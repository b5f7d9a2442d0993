"""The exercise checks of lessons 02 and 03: right answers pass, stubs say so, typical bugs are named."""

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from helpers.checks import (
    check_hard_lookup,
    check_log_softmax,
    check_one_query,
    check_self_attention,
    check_softmax_backward,
    check_temperature_for_entropy,
)
from helpers.checks.lesson02 import run_check_with_hints
from helpers.checks.lesson03 import _softmax_backward


def stub(*args):
    return None


def outcome(check, fn, capsys):
    """Run a check; return (its truth value, the single line it printed)."""
    ok = bool(check(fn))
    lines = capsys.readouterr().out.strip().split("\n")
    assert len(lines) == 1, f"a check must print exactly one line, got {lines}"
    return ok, lines[0]


ALL_CHECKS = [check_one_query, check_self_attention, check_hard_lookup, check_log_softmax,
              check_softmax_backward, check_temperature_for_entropy]


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_a_stub_is_not_implemented_yet(check, capsys):
    ok, line = outcome(check, stub, capsys)
    assert not ok and line.startswith("…") and "not implemented yet" in line


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_a_crash_is_reported_not_raised(check, capsys):
    def crashes(*args):
        raise IndexError("boom")
    ok, line = outcome(check, crashes, capsys)
    assert not ok and "raised IndexError: boom" in line


# --- lesson 02 ------------------------------------------------------------------------------------

def one_query_loop(q, k, v):
    scores = torch.stack([(q * k[j]).sum() for j in range(k.shape[0])]) / math.sqrt(q.shape[0])
    weights = torch.exp(scores) / torch.exp(scores).sum()
    return sum(weights[j] * v[j] for j in range(k.shape[0]))


def test_check_one_query(capsys):
    assert outcome(check_one_query, one_query_loop, capsys) == (
        True, "✓ one_query: matches the reference on all 3 cases")
    ok, line = outcome(check_one_query, lambda q, k, v: torch.softmax(k @ q, -1) @ v, capsys)
    assert not ok and "D=4, S=5" in line and "divide the scores by sqrt(D)" in line
    ok, line = outcome(check_one_query, lambda q, k, v: v.mean(0), capsys)
    assert not ok and "plain mean of the values" in line
    ok, line = outcome(check_one_query, lambda q, k, v: torch.softmax(k @ q / 2.0, -1), capsys)
    assert not ok and "shape" in line  # returned the weights (S,) instead of the output (Dv,)


def self_attention(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v, weights


def test_check_self_attention(capsys):
    assert outcome(check_self_attention, self_attention, capsys)[0]
    ok, line = outcome(check_self_attention, lambda x, w_q, w_k, w_v: self_attention(x, w_q, w_k, w_v)[0],
                       capsys)
    assert not ok and "expected a tuple of 2 results" in line
    bugs = {
        "the values are x @ w_v": lambda x, w_q, w_k, w_v: self_attention(x, w_q, w_k, torch.eye(x.shape[-1])),
        "divides by sqrt(C)": lambda x, w_q, w_k, w_v: self_attention(
            x, w_q * math.sqrt(w_q.shape[-1] / x.shape[-1]), w_k, w_v),
        "no 1/sqrt(D) scaling": lambda x, w_q, w_k, w_v: self_attention(x, w_q * math.sqrt(w_q.shape[-1]), w_k, w_v),
    }
    for hint, buggy in bugs.items():
        ok, line = outcome(check_self_attention, buggy, capsys)
        assert not ok and hint in line, line

    def over_queries(x, w_q, w_k, w_v):
        scores = (x @ w_q) @ (x @ w_k).transpose(-2, -1) / math.sqrt(w_q.shape[-1])
        weights = torch.softmax(scores, dim=-2)
        return weights @ (x @ w_v), weights
    ok, line = outcome(check_self_attention, over_queries, capsys)
    assert not ok and "softmax runs over the queries" in line


def test_check_hard_lookup(capsys):
    def hard(q, k, v):
        return v[(q @ k.T).argmax(dim=1)]
    assert outcome(check_hard_lookup, hard, capsys)[0]
    ok, line = outcome(check_hard_lookup, lambda q, k, v: v[torch.cdist(q, k).argmin(dim=1)], capsys)
    assert not ok and "nearest key" in line
    ok, line = outcome(check_hard_lookup, lambda q, k, v: torch.softmax(q @ k.T / q.shape[-1] ** 0.5, -1) @ v, capsys)
    assert not ok and "soft attention" in line


def test_hints_only_name_a_bug_that_reproduces_the_answer(capsys):
    from helpers.checks import Case
    cases = [Case("x = 1", (torch.ones(2),)), Case("x = 2", (2 * torch.ones(2),))]
    hints = [("doubled", lambda x: 2 * x)]
    assert not run_check_with_hints("triple", lambda x: 4 * x, lambda x: 3 * x, cases, hints)
    assert "Hint" not in capsys.readouterr().out  # 4x is not the known bug 2x: no hint
    assert not run_check_with_hints("triple", lambda x: 2 * x, lambda x: 3 * x, cases, hints)
    assert "Hint: doubled" in capsys.readouterr().out


# --- lesson 03 ------------------------------------------------------------------------------------

def test_check_log_softmax(capsys):
    def stable(x):
        m = x.amax(-1, keepdim=True)
        return x - m - torch.log(torch.exp(x - m).sum(-1, keepdim=True))
    assert outcome(check_log_softmax, stable, capsys)[0]
    ok, line = outcome(check_log_softmax, lambda x: torch.log(torch.softmax(x, -1)), capsys)
    assert not ok and "+-1e4" in line and "log(softmax(x)) is -inf" in line
    ok, line = outcome(check_log_softmax, lambda x: x - torch.log(torch.exp(x).sum(-1, keepdim=True)), capsys)
    assert not ok and "subtract the row max" in line


def test_check_softmax_backward(capsys):
    def backward(p, grad_p):
        J = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # (..., S, S)
        return (J @ grad_p.unsqueeze(-1)).squeeze(-1)
    assert outcome(check_softmax_backward, backward, capsys)[0]
    bugs = {"term -p (p . grad_p)": lambda p, g: p * g,
            "plain mean": lambda p, g: p * (g - g.mean(-1, keepdim=True)),
            "lacks the factor p": lambda p, g: g - (p * g).sum(-1, keepdim=True),
            "opposite sign": lambda p, g: -backward(p, g)}
    for hint, buggy in bugs.items():
        ok, line = outcome(check_softmax_backward, buggy, capsys)
        assert not ok and hint in line, line


def bisect_temperature(scores, target):
    lo, hi = math.log(1e-4), math.log(1e4)  # bisect on log tau: entropy grows with tau
    for _ in range(60):
        mid = (lo + hi) / 2
        p = torch.softmax(scores / math.exp(mid), -1)
        if -torch.xlogy(p, p).sum() < target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def test_check_temperature_for_entropy(capsys):
    assert outcome(check_temperature_for_entropy, bisect_temperature, capsys)[0]
    ok, line = outcome(check_temperature_for_entropy, lambda s, t: 1.0, capsys)
    assert not ok and "target entropy 1.0" in line and "expected 1" in line
    ok, line = outcome(check_temperature_for_entropy, lambda s, t: 1 / bisect_temperature(s, t), capsys)
    assert not ok and "✗ temperature_for_entropy" in line
    ok, line = outcome(check_temperature_for_entropy, lambda s, t: -1.0, capsys)
    assert not ok and "must be positive" in line


@given(st.integers(2, 9), st.integers(0, 2**16), st.floats(0.1, 10.0))
def test_reference_softmax_backward_equals_autograd(S, seed, spread):
    """The check's reference p * (g - p.g) is the gradient autograd gets through torch.softmax."""
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(S, generator=g, dtype=torch.float64) * spread).requires_grad_()
    grad_p = torch.randn(S, generator=g, dtype=torch.float64)
    (expected,) = torch.autograd.grad(torch.softmax(s, -1), s, grad_outputs=grad_p)
    assert torch.allclose(_softmax_backward(torch.softmax(s, -1).detach(), grad_p), expected, atol=1e-12)
