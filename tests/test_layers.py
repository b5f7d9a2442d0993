"""helpers.layers (lesson 07): the feed-forward net, and the residual sub-layer with where its norm and dropout sit."""

import pytest
import torch
from torch import nn

from helpers.layers import FeedForward, Residual

DT = torch.float64


@pytest.mark.parametrize("norm_first", [True, False])
def test_residual_is_pre_ln_or_post_ln(norm_first):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=DT)
    norm = torch.nn.LayerNorm(8).to(DT)

    def sublayer(h):
        return 2.0 * h + 1.0

    def dropout(h):
        return 0.5 * h  # stands for the dropout layer: its place in the formula is what is tested

    got = Residual(dropout, norm_first)(x, sublayer, norm)
    expected = x + 0.5 * sublayer(norm(x)) if norm_first else norm(x + 0.5 * sublayer(x))
    assert torch.equal(got, expected)


def test_residual_refuses_a_norm_first_that_is_not_a_bool():
    with pytest.raises(TypeError, match=r"norm_first must be True \(Pre-LN\) or False \(Post-LN\), got 1"):
        Residual(torch.nn.Dropout(0.0), 1)


def test_layers_keep_their_state_dict_and_printout():
    """The Residual is no submodule: the layers' parameter names and printout are those lessons 07 and 11 show."""
    from helpers.transformer import DecoderLayer, EncoderLayer, TransformerConfig

    cfg = TransformerConfig.tiny(5, 5)
    enc, dec = EncoderLayer(cfg), DecoderLayer(cfg)
    assert [name for name, _ in enc.named_children()] == ["self_attn", "ff", "norm1", "norm2", "dropout"]
    assert [name for name, _ in dec.named_children()] == ["self_attn", "cross_attn", "ff", "norm1", "norm2",
                                                         "norm3", "dropout"]
    assert "Residual" not in repr(enc) and enc.residual.dropout is enc.dropout


def test_feed_forward_is_relu_between_two_linears():
    ff = FeedForward(6, 10).to(DT)
    x = torch.randn(2, 3, 6, dtype=DT, generator=torch.Generator().manual_seed(0))
    expected = ff.linear2(torch.relu(ff.linear1(x)))
    assert torch.allclose(ff(x), expected, atol=1e-10)
    assert isinstance(ff.dropout, nn.Dropout)
