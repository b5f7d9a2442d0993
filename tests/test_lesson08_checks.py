"""The exercise checks of lesson 08: right answers pass, stubs say "not implemented", bugs are named."""

import torch

from helpers.checks import (
    check_decoder_layer_params,
    check_decoder_self_mask,
    check_length_normalised_score,
    check_teacher_forcing,
)
from helpers.masks import causal_mask


def test_check_teacher_forcing(capsys):
    assert check_teacher_forcing(lambda tgt: (tgt[:, :-1], tgt[:, 1:]))
    assert "✓ teacher_forcing" in capsys.readouterr().out
    assert not check_teacher_forcing(lambda tgt: None)
    assert "not implemented yet" in capsys.readouterr().out
    assert not check_teacher_forcing(lambda tgt: (tgt[:, 1:], tgt[:, :-1]))  # swapped
    assert "✗ teacher_forcing" in capsys.readouterr().out
    assert not check_teacher_forcing(lambda tgt: (tgt, tgt[:, 1:]))  # input not cut
    assert "shape" in capsys.readouterr().out


def test_check_decoder_self_mask(capsys):
    def right(tgt, pad_id):
        return causal_mask(tgt.shape[1]) & (tgt != pad_id)[:, None, None, :]

    assert check_decoder_self_mask(right)
    assert "✓ decoder_self_mask" in capsys.readouterr().out
    assert not check_decoder_self_mask(lambda tgt, pad_id: None)
    assert "not implemented yet" in capsys.readouterr().out
    no_padding = lambda tgt, pad_id: causal_mask(tgt.shape[1]).expand(tgt.shape[0], 1, -1, -1)  # noqa: E731
    assert not check_decoder_self_mask(no_padding)
    assert "second ending in two pads" in capsys.readouterr().out
    queries_padded = lambda tgt, pad_id: causal_mask(tgt.shape[1]) & (tgt != pad_id)[:, None, :, None]  # noqa: E731
    assert not check_decoder_self_mask(queries_padded)
    assert "✗ decoder_self_mask" in capsys.readouterr().out
    assert not check_decoder_self_mask(lambda tgt, pad_id: right(tgt, pad_id).float())
    assert "must be boolean" in capsys.readouterr().out


def test_check_decoder_layer_params(capsys):
    def right(C, F):
        return 2 * 4 * (C * C + C) + (C * F + F) + (F * C + C) + 6 * C

    assert check_decoder_layer_params(right)
    assert "✓ decoder_layer_params" in capsys.readouterr().out
    assert not check_decoder_layer_params(lambda C, F: None)
    assert "not implemented yet" in capsys.readouterr().out
    assert not check_decoder_layer_params(lambda C, F: right(C, F) - 4 * (C * C + C))  # forgot cross-attention
    assert "✗ decoder_layer_params: on d_model=64, d_ff=128" in capsys.readouterr().out
    assert not check_decoder_layer_params(lambda C, F: 2 * 4 * C * C + 2 * C * F)  # no biases or norms
    assert "got 49152, expected 50240" in capsys.readouterr().out


def test_check_length_normalised_score(capsys):
    assert check_length_normalised_score(lambda lp, n, a: lp / ((5 + n) / 6) ** a)
    assert "✓ length_normalised_score" in capsys.readouterr().out
    assert not check_length_normalised_score(lambda lp, n, a: None)
    assert "not implemented yet" in capsys.readouterr().out
    assert not check_length_normalised_score(lambda lp, n, a: lp / n ** a)  # plain length normalisation
    assert "✗ length_normalised_score: on log_prob=-3.0, length=11" in capsys.readouterr().out
    assert not check_length_normalised_score(lambda lp, n, a: lp * ((5 + n) / 6) ** a)  # multiplies
    assert "✗ length_normalised_score" in capsys.readouterr().out


def test_reference_count_is_the_module_count():
    from helpers.transformer import DecoderLayer, TransformerConfig

    cfg = TransformerConfig(10, 10, d_model=64, n_heads=4, d_ff=128, n_encoder_layers=1, n_decoder_layers=1,
                            dropout=0.0, max_len=8)
    expected = 2 * 4 * (64 * 64 + 64) + 2 * 64 * 128 + 128 + 64 + 6 * 64
    assert sum(p.numel() for p in DecoderLayer(cfg).parameters()) == expected == 50240
    assert torch.equal(causal_mask(2), torch.tensor([[True, False], [True, True]]))
