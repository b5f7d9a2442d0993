"""Lesson 07's checks: right answers pass with the stored line, stubs say so, wrong answers are named."""

import pytest
import torch
import torch.nn.functional as F

import helpers.checks as checks


def _rms_norm(x, gain, eps=1e-6):
    return gain * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _ffn(x, w1, b1, w2, b2):
    return F.gelu(x @ w1.T + b1) @ w2.T + b2



CHECKS = {  # check: (right answer, stored success line, [(wrong answer, words its message must contain)])
    "check_rms_norm": (_rms_norm, "✓ rms_norm: matches the reference on all 3 cases", [
        (lambda x, g, eps=1e-6: g * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True,
                                                                                        unbiased=False) + eps),
         "that is LayerNorm"),
        (lambda x, g, eps=1e-6: g * x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps), "the wrong axis"),
        (lambda x, g, eps=1e-6: g * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps), "inside the square root"),
        (lambda x, g, eps=1e-6: g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
         "on x (3, 16) with eps=0.5"),
        (lambda x, g, eps=1e-6: _rms_norm(x, g, eps).double(), "return dtype torch.float32"),
        (lambda x, g, eps=1e-6: x.mul_(g).div_(torch.sqrt(x.pow(2).mean(-1, keepdim=True) / g.pow(2).mean() + eps)),
         "in place"),
    ]),
    "check_feed_forward_gelu": (_ffn, "✓ feed_forward_gelu: matches the reference on all 2 cases", [
        (lambda x, w1, b1, w2, b2: torch.relu(x @ w1.T + b1) @ w2.T + b2, "you used ReLU"),
        (lambda x, w1, b1, w2, b2: (x @ w1.T + b1) @ w2.T + b2, "the activation is missing"),
        (lambda x, w1, b1, w2, b2: F.gelu((x @ w1.T + b1) @ w2.T + b2), "after the second layer"),
        (lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T + b1, approximate="tanh") @ w2.T + b2, "tanh approximation"),
        (lambda x, w1, b1, w2, b2: F.gelu(x @ w1.T) @ w2.T, "✗ feed_forward_gelu"),
        (lambda x, w1, b1, w2, b2: _ffn(x, w1, b1, w2, b2).numpy(), "return a torch.Tensor"),
    ]),
    "check_deepnorm_sublayer": (lambda x, s, n, a: n(a * x + s(x)),
                                "✓ deepnorm_sublayer: matches the reference on all 2 cases", [
        (lambda x, s, n, a: n(x + a * s(x)), "alpha scales the sub-layer"),
        (lambda x, s, n, a: n(x + s(x)), "alpha is ignored"),
        (lambda x, s, n, a: a * x + s(n(x)), "Pre-LN style"),
        (lambda x, s, n, a: n(x.mul_(a) + s(x / a)), "in place"),
    ]),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_lesson07_checks(name, accepts, rejects):
    check = getattr(checks, name)
    right, line, wrongs = CHECKS[name]
    accepts(check, right, line)
    rejects(check, lambda *a, **k: None, "not implemented yet")
    rejects(check, lambda *a, **k: 1 / 0, "ZeroDivisionError")  # a crash in the learner's code is reported
    for wrong, words in wrongs:
        rejects(check, wrong, words)


def test_deepnorm_rejects_a_changed_module(rejects):
    def retunes_norm(x, s, n, a):
        with torch.no_grad():
            n.weight.fill_(1.0)
        return n(a * x + s(x))
    rejects(checks.check_deepnorm_sublayer, retunes_norm, "changed the parameters of the module")
