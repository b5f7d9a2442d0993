"""The exercise checkers: right answers pass, stubs say "not implemented", bugs are named."""

import torch

from helpers.attention import scaled_dot_product_attention
from helpers.checks import check_attention, check_softmax


def test_check_softmax(capsys):
    assert check_softmax(lambda x: torch.softmax(x, dim=-1))
    assert "✓ softmax" in capsys.readouterr().out
    assert not check_softmax(lambda x: None)
    assert "not implemented yet" in capsys.readouterr().out
    naive = lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)  # noqa: E731
    assert not check_softmax(naive)
    assert "+-1e4" in capsys.readouterr().out
    assert not check_softmax(lambda x: torch.softmax(x, dim=0))
    assert "values differ" in capsys.readouterr().out


def test_check_attention(capsys):
    assert check_attention(scaled_dot_product_attention)  # returns (out, weights)
    assert check_attention(lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ v)
    capsys.readouterr()
    unscaled = lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v  # noqa: E731
    assert not check_attention(unscaled)
    assert "✗ attention" in capsys.readouterr().out

    def crashes(q, k, v):
        return q @ k  # wrong: k not transposed
    assert not check_attention(crashes)
    assert "raised RuntimeError" in capsys.readouterr().out
