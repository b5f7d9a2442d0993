"""Exercise checks of lesson 08: the encoder-decoder Transformer (each prints one line, returns True/False)."""

from __future__ import annotations

import torch

from helpers.checks._core import Bug, Case, CheckResult, check, check_prediction

__all__ = ["check_teacher_forcing", "check_decoder_self_mask", "check_decoder_layer_params",
           "check_length_normalised_score", "check_predict_decoder_ratio"]


def _teacher_forcing(tgt):
    return tgt[:, :-1], tgt[:, 1:]  # (B, T + 1) -> (B, T), (B, T)


def check_teacher_forcing(fn) -> CheckResult:
    """Check ``teacher_forcing(tgt (B, T + 1)) -> (decoder_input (B, T), labels (B, T))`` (lesson 08)."""
    framed = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])  # <s> ... </s>, then a pad
    cases = [Case("two targets framed by <s>=1 and </s>=2, the second padded with 0", (framed,)),
             Case("one target of 12 ids (a date: <s>, 10 characters, </s>)",
                  (torch.tensor([[1, 5, 12, 12, 4, 3, 3, 6, 3, 7, 8, 2]]),))]
    bugs = [Bug("the two are swapped: the decoder reads tgt[:, :-1] and learns to predict tgt[:, 1:]",
                lambda t: (t[:, 1:], t[:, :-1])),
            Bug("the decoder input must have T tokens, not T + 1: drop the last token, tgt[:, :-1]",
                lambda t: (t, t[:, 1:]))]
    return check("teacher_forcing", fn, _teacher_forcing, cases, bugs=bugs)


def _decoder_self_mask(tgt, pad_id):
    T = tgt.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril()  # (T, T)
    return causal & (tgt != pad_id)[:, None, None, :]  # (T, T) & (B, 1, 1, T) -> (B, 1, T, T)


def check_decoder_self_mask(fn) -> CheckResult:
    """Check ``decoder_self_mask(tgt (B, T), pad_id) -> (B, 1, T, T)`` bool, True = may attend (lesson 08)."""
    cases = [Case("one target without padding, T=4", (torch.tensor([[1, 5, 6, 7]]), 0)),
             Case("two targets, the second ending in two pads (pad_id=0): pads must be hidden as keys",
                  (torch.tensor([[1, 5, 6, 7, 8], [1, 9, 4, 0, 0]]), 0)),
             Case("pad_id=3 instead of 0", (torch.tensor([[1, 5, 3], [1, 3, 3]]), 3))]

    bugs = [Bug("the padding is missing: pads must also be hidden as keys, causal & (tgt != pad_id)[:, None, None, :]",
                lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).tril().expand(t.shape[0], 1, -1, -1)),
            Bug("the causal part is missing: query t must not see keys after t",
                lambda t, p: (t != p)[:, None, None, :].expand(-1, 1, t.shape[1], -1)),
            Bug("polarity flipped: True must mean 'may attend'", lambda t, p: ~_decoder_self_mask(t, p)),
            # With right padding, hiding pads as queries only and as queries and keys give the same mask.
            Bug("mask the pads only as keys, (tgt != pad_id)[:, None, None, :]: a pad's own row (its query) must "
                "still see the real tokens before it, or that row is fully masked",
                lambda t, p: torch.ones(t.shape[1], t.shape[1], dtype=torch.bool).tril() & (t != p)[:, None, :, None])]
    return check("decoder_self_mask", fn, _decoder_self_mask, cases, bugs=bugs)


def _decoder_layer_params(d_model, d_ff):
    from helpers.transformer import DecoderLayer, TransformerConfig

    config = TransformerConfig(10, 10, d_model=d_model, n_heads=1, d_ff=d_ff, n_encoder_layers=1,
                               n_decoder_layers=1, dropout=0.0, max_len=8)
    return sum(p.numel() for p in DecoderLayer(config).parameters())


def check_decoder_layer_params(fn) -> CheckResult:
    """Check ``decoder_layer_params(d_model, d_ff) -> int``, the parameters of one DecoderLayer (lesson 08)."""
    cases = [Case("d_model=64, d_ff=128 (this lesson's model)", (64, 128)),
             Case("d_model=512, d_ff=2048 (the 2017 paper's base model)", (512, 2048)),
             Case("d_model=8, d_ff=3", (8, 3))]

    def encoder_like(d, f):  # one attention and two LayerNorms: an encoder layer
        return 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d

    bugs = [Bug("that is an encoder layer: a decoder layer adds a cross-attention (4 d^2 + 4 d) and a "
                "third LayerNorm (2 d)",
                encoder_like),
            Bug("the LayerNorms are missing: three of them, 2 * d_model parameters each",
                lambda d, f: _decoder_layer_params(d, f) - 6 * d),
            Bug("the biases are missing", lambda d, f: _decoder_layer_params(d, f) - 8 * d - f - d)]
    return check("decoder_layer_params", fn, _decoder_layer_params, cases, bugs=bugs)


def _length_normalised_score(log_prob, length, alpha):
    return log_prob / ((5 + length) / 6) ** alpha  # Wu et al. 2016, Eq. 14


def check_length_normalised_score(fn) -> CheckResult:
    """Check ``length_normalised_score(log_prob, length, alpha)``, Wu et al. 2016 Eq. 14 (lesson 08)."""
    cases = [Case("log_prob=-3.0, length=11, alpha=0.6", (-3.0, 11, 0.6)),
             Case("log_prob=-3.0, length=1, alpha=0.6 (a one-token hypothesis: the penalty is 1)", (-3.0, 1, 0.6)),
             Case("alpha=0: no normalisation at all", (-2.5, 7, 0.0)),
             Case("tensors: log_prob (3,), length (3,), alpha=1.0",
                  (torch.tensor([-1.0, -4.0, -0.5], dtype=torch.float64),
                   torch.tensor([2, 10, 30], dtype=torch.float64), 1.0))]
    bugs = [Bug("that divides by length ** alpha; Wu et al.'s penalty is ((5 + length) / 6) ** alpha",
                lambda lp, n, a: lp / n ** a),
            Bug("the penalty multiplies; the log-probability is divided by ((5 + length) / 6) ** alpha",
                lambda lp, n, a: lp * ((5 + n) / 6) ** a)]
    # rtol 1e-5: an answer computed in float32 (a tensor made from the Python float) passes, and a value
    # it rejects differs from the reference in the 6 significant digits that the message prints.
    return check("length_normalised_score", fn, _length_normalised_score, cases, bugs=bugs, atol=1e-9, rtol=1e-5)


def _decoder_ratio(d_model: int = 512, d_ff: int = 2048) -> float:
    from helpers.transformer import EncoderLayer, TransformerConfig

    config = TransformerConfig(10, 10, d_model=d_model, n_heads=8, d_ff=d_ff, n_encoder_layers=1,
                               n_decoder_layers=1, dropout=0.0, max_len=8)
    encoder = sum(p.numel() for p in EncoderLayer(config).parameters())
    return _decoder_layer_params(d_model, d_ff) / encoder


def check_predict_decoder_ratio(predicted) -> CheckResult:
    """Predict then measure: parameters of a decoder layer / an encoder layer at d_model=512, d_ff=2048 (lesson 08)."""
    return check_prediction("predict_decoder_ratio", predicted, _decoder_ratio,
                            "decoder / encoder parameter ratio", abs_tol=0.05)
