"""Exercise checks of lesson 03: log-softmax, softmax backward, temperature for an entropy (one line each)."""

from __future__ import annotations

import math

import torch

from helpers.attention import softmax
from helpers.checks._core import Bug, Case, CheckResult, Reject, Slip, check, check_prediction, describe, randn, slip_at
from helpers.device import peak_memory

__all__ = ["check_log_softmax", "check_softmax_backward", "check_temperature_for_entropy",
           "check_predict_score_std"]



def check_log_softmax(fn) -> CheckResult:
    """Check ``log_softmax(x)`` over the last dimension, including logits of +-1e4 (lesson 03)."""
    g = torch.Generator().manual_seed(5)
    cases = [
        Case("a (3, 5) tensor of small logits", (randn(g, 3, 5),)),
        Case("a (2, 4, 6) tensor", (randn(g, 2, 4, 6),)),
        Case("logits of size +-1e4 (exp overflows, softmax underflows to 0)", (randn(g, 4, 7) * 1e4,)),
    ]
    bugs = [
        Bug("log(softmax(x)) is -inf where softmax underflows to 0: compute x - max - log(sum(exp(x - max)))",
            lambda x: torch.log(torch.softmax(x, dim=-1))),
        Bug("exp(x) overflows for large logits: subtract the row max before exp",
            lambda x: x - torch.log(torch.exp(x).sum(dim=-1, keepdim=True))),
        Bug("the max is subtracted inside exp but not outside: log_softmax(x) = (x - m) - log(sum(exp(x - m)))",
            lambda x: x - torch.log(torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True))),
        Bug("your sum runs over the first dimension: normalise over the last one (dim=-1)",
            lambda x: torch.log_softmax(x, dim=0)),
        Bug("that is the softmax, not its log: log_softmax(x) = x - max - log(sum(exp(x - max)))",
            lambda x: torch.softmax(x, dim=-1)),
        Bug("that is log base 2 (or 10): log_softmax uses the natural log, torch.log",
            lambda x: torch.log_softmax(x, dim=-1) / math.log(2)),
        Bug("that is log base 10 of the sum: log_softmax uses the natural log, torch.log",
            lambda x: x - x.amax(-1, keepdim=True) - torch.log10(torch.exp(x - x.amax(-1, keepdim=True))
                                                                  .sum(-1, keepdim=True))),
        Bug("you subtract the max of the whole tensor: each row needs its own, x.amax(dim=-1, keepdim=True)",
            lambda x: x - x.max() - torch.log(torch.exp(x - x.max()).sum(-1, keepdim=True))),
        Bug("the log of the sum is added: log p_i = x_i - m - log(sum(exp(x - m))), with a minus",
            lambda x: x - x.amax(-1, keepdim=True) + torch.log(torch.exp(x - x.amax(-1, keepdim=True))
                                                               .sum(-1, keepdim=True))),
        Bug("the term - log(sum(exp(x - m))) is missing: x - m alone is not normalised",
            lambda x: x - x.amax(-1, keepdim=True)),
    ]
    return check("log_softmax", fn, lambda x: torch.log_softmax(x, dim=-1), cases, bugs=bugs)


def _softmax_backward(p, grad_p):
    # J^T g with J = diag(p) - p p^T (symmetric): p * g - p (p . g), without building the (S, S) matrix
    return p * (grad_p - (p * grad_p).sum(dim=-1, keepdim=True))  # (..., S)


def _no_jacobian(fn, S: int = 2048):
    """Run fn on one row of S scores: it must allocate far less than one (S, S) Jacobian."""
    g = torch.Generator().manual_seed(8)
    p, grad_p = torch.softmax(torch.randn(S, generator=g), dim=-1), torch.randn(S, generator=g)
    used = peak_memory(fn, p, grad_p, device="cpu")
    jacobian = S * S * p.element_size()
    if used >= jacobian // 4:
        return False, (f"the values are right, but on one row of S={S} scores it allocated {used:,} bytes, "
                       f"a quarter or more of the (S, S) Jacobian ({jacobian:,} bytes): use "
                       "p * (grad_p - (p * grad_p).sum(-1, keepdim=True)) without building it")
    return True, ""


def check_softmax_backward(fn) -> CheckResult:
    """Check ``softmax_backward(p (..., S), grad_p (..., S)) -> (..., S)``, no (S, S) Jacobian (lesson 03)."""
    g = torch.Generator().manual_seed(6)
    cases = [
        Case("one row of 5 scores", (torch.softmax(randn(g, 5), dim=-1), randn(g, 5))),
        Case("a uniform p of length 4", (torch.full((4,), 0.25), randn(g, 4))),
        Case("a one-hot p (a saturated softmax passes no gradient)", (torch.tensor([0.0, 1.0, 0.0]), randn(g, 3))),
        Case("a batch of rows (2, 3, 6)", (torch.softmax(randn(g, 2, 3, 6), dim=-1), randn(g, 2, 3, 6))),
    ]
    bugs = [
        Bug("your answer is p * grad_p: the term -p (p . grad_p) from -p p^T is missing",
            lambda p, gp: p * gp),
        Bug("your answer subtracts the plain mean of grad_p: subtract the p-weighted sum (p . grad_p)",
            lambda p, gp: p * (gp - gp.mean(dim=-1, keepdim=True))),
        Bug("your answer lacks the factor p: the result is p * (grad_p - (p . grad_p))",
            lambda p, gp: gp - (p * gp).sum(dim=-1, keepdim=True)),
        Bug("your answer has the opposite sign", lambda p, gp: -_softmax_backward(p, gp)),
        Bug("that keeps only the diagonal of J, p (1 - p) grad_p: the off-diagonal terms -p_i p_j couple every "
            "score to every other, so p . grad_p is a sum over the row, (p * grad_p).sum(dim=-1, keepdim=True)",
            lambda p, gp: gp * (p - p ** 2)),
        Bug("your sum runs over the whole tensor: sum each row, (p * grad_p).sum(dim=-1, keepdim=True)",
            lambda p, gp: p * (gp - (p * gp).sum())),
        Bug("your sum runs over the first dimension: sum over the last one, dim=-1",
            lambda p, gp: p * (gp - (p * gp).sum(dim=0, keepdim=True))),
        Bug("the second term lacks its factor p: p * grad_p - p * (p . grad_p)",
            lambda p, gp: p * gp - (p * gp).sum(dim=-1, keepdim=True)),
    ]
    return check("softmax_backward", fn, _softmax_backward, cases, bugs=bugs, then=_no_jacobian)


def _entropy(p):
    return -torch.xlogy(p, p).sum(dim=-1)  # nats; 0 log 0 counts as 0


class _Reached(float):
    """The entropy (nats) that a learner's tau gives, remembering that tau for the check's message."""

    def __new__(cls, entropy: float, tau: float):
        reached = super().__new__(cls, entropy)
        reached.tau = tau
        return reached


def _solve_tau(scores, target: float) -> float:
    """The temperature whose softmax(scores / tau) has the target entropy, by bisection on log tau."""
    lo, hi = -12.0, 12.0  # log tau: the entropy grows with tau
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(_entropy(softmax(scores / math.exp(mid)))) < target else (lo, mid)
    return math.exp((lo + hi) / 2)


def check_temperature_for_entropy(fn) -> CheckResult:
    """Check ``temperature_for_entropy(scores, target) -> tau``: the entropy tau gives is target +- 1e-3 (lesson 03)."""
    g = torch.Generator().manual_seed(7)
    scores = randn(g, 8).double() * 3.0
    cases = [
        Case("8 scores, target entropy 1.0 nats", (scores, 1.0)),
        Case("8 scores, target 2.0 (near the uniform log 8 = 2.08: tau is large)", (scores, 2.0)),
        Case("8 scores, target 0.1 (nearly one-hot: tau is small)", (scores, 0.1)),
        Case("16 scores of size 30, target 1.5", (randn(g, 16).double() * 30.0, 1.5)),
    ]
    atol = 1e-3
    bugs = [Bug("the entropy must be in nats (natural log), not bits: use torch.log, not torch.log2",
                lambda scores, target: target * math.log(2)),  # target bits are target * ln 2 nats
            Bug("your tau works the other way round: the weights are softmax(scores / tau), so a larger tau "
                "flattens them (you returned 1 / tau)",
                lambda scores, target: float(_entropy(softmax(scores * _solve_tau(scores, target)))))]

    def entropy_reached(scores, target):
        tau = fn(scores, target)
        if tau is None:
            return None
        if isinstance(tau, torch.Tensor) and tau.numel() == 1:
            tau = tau.item()
        if isinstance(tau, bool) or not isinstance(tau, (int, float)):
            return Reject(f"return the temperature as a number, got {describe(tau)}")
        def off(t):  # how far the entropy at temperature t lies from the target
            return abs(float(_entropy(softmax(scores / t))) - target)

        if math.isfinite(tau) and abs(tau) < 700 and off(math.exp(tau)) <= atol and not (tau > 0 and off(tau) <= atol):
            return Reject(f"that is log tau ({tau:.6g}): you bisect on log tau, so return its exp, "
                          f"tau = {math.exp(tau):.6g}")
        if not tau > 0.0:
            return Reject(f"a temperature must be positive, got tau = {tau}")
        return _Reached(float(_entropy(softmax(scores / tau))), float(tau))

    def say_tau(got, expected):
        # the engine would print "got 0.693, expected 1", which reads like a tau: name tau and entropy apart
        if not isinstance(got, _Reached) or abs(got - expected) <= atol:
            return got
        return Reject(f"your tau = {got.tau:.6g} gives entropy {float(got):.6g} nats; the target is "
                      f"{expected:.6g} nats")

    return check("temperature_for_entropy", entropy_reached, lambda scores, target: float(target),
                 cases, bugs=bugs, atol=atol, rtol=0.0, adapt=say_tau)


def _score_std(D: int = 64) -> float:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(20000, D, generator=g), torch.randn(20000, D, generator=g)  # unit-variance entries
    return (q * k).sum(dim=-1).std().item()  # the unscaled score q . k of 20000 pairs


def check_predict_score_std(predicted) -> CheckResult:
    """Predict then measure: the standard deviation of q . k for random unit-variance q, k of width 64 (lesson 03)."""
    slips = [slip_at(64, "64 is the variance of q . k (d_k = 64); the standard deviation is its square root"),
             slip_at(1, "1 is the standard deviation after the division by sqrt(d_k); this score is unscaled"),
             slip_at(0.125, "1/8 = 1/sqrt(64) is the scaling factor, not the spread of the score"),
             slip_at(4096, "4096 = 64^2 squares the width: the variance is d_k = 64, the standard deviation 8"),
             slip_at(32, "32 halves the width: each of the 64 products q_i k_i has variance 1, and variances add"),
             slip_at(math.sqrt(8), "sqrt(8) takes the square root twice: the variance is 64, so the standard "
                     "deviation is sqrt(64)"),
             Slip("0 is the mean of q . k (positive and negative products cancel on average); the question asks "
                  "for its spread", lambda p, m: p == 0),
             Slip("a standard deviation is never negative", lambda p, m: p < 0)]
    return check_prediction("predict_score_std", predicted, _score_std,
                            "standard deviation of q . k at D=64", rel_tol=0.1, slips=slips)
