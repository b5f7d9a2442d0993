"""Lesson 08's checks: right answers pass with the stored line, stubs say so, wrong answers are named."""

import torch

from helpers.checks import (
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
    assert "drop the last token" in capsys.readouterr().out


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
    assert "return dtype torch.bool, got torch.float32" in capsys.readouterr().out


def test_check_length_normalised_score(capsys):
    assert check_length_normalised_score(lambda lp, n, a: lp / ((5 + n) / 6) ** a)
    assert "✓ length_normalised_score" in capsys.readouterr().out
    assert not check_length_normalised_score(lambda lp, n, a: None)
    assert "not implemented yet" in capsys.readouterr().out
    assert not check_length_normalised_score(lambda lp, n, a: lp / n ** a)  # plain length normalisation
    assert "✗ length_normalised_score: on log_prob=-3.0, length=11" in capsys.readouterr().out
    assert not check_length_normalised_score(lambda lp, n, a: lp * ((5 + n) / 6) ** a)  # multiplies
    assert "✗ length_normalised_score" in capsys.readouterr().out


def test_length_normalised_score_accepts_float32(capsys):
    # a tensor made from a Python float is float32: right to about 1e-7, which must pass
    assert check_length_normalised_score(lambda lp, n, a: torch.as_tensor(lp) / ((5 + torch.as_tensor(n)) / 6) ** a)
    assert "✓ length_normalised_score" in capsys.readouterr().out
    # a value it rejects must differ from the reference in the digits the message prints
    assert not check_length_normalised_score(lambda lp, n, a: lp / ((5 + n) / 6) ** a * (1 + 2e-5))
    line = capsys.readouterr().out
    got, expected = line.split("got ")[1].split(", expected ")
    assert got.strip() != expected.strip()


def test_decoder_self_mask_pads_as_queries(capsys):
    def causal(tgt):
        return causal_mask(tgt.shape[1])

    def queries_only(tgt, pad_id):
        return causal(tgt) & (tgt != pad_id)[:, None, :, None]

    def queries_and_keys(tgt, pad_id):
        return causal(tgt) & (tgt != pad_id)[:, None, :, None] & (tgt != pad_id)[:, None, None, :]

    for wrong in (queries_only, queries_and_keys):  # the same mask on right-padded targets
        assert not check_decoder_self_mask(wrong)
        assert "you hid the pads as queries (rows)" in capsys.readouterr().out
    assert check_decoder_self_mask(lambda tgt, pad_id: causal(tgt) & (tgt != pad_id)[:, None, None, :])
    assert "✓ decoder_self_mask" in capsys.readouterr().out


def test_more_wrong_answers(accepts, rejects):
    accepts(check_teacher_forcing, lambda t: (t[:, :-1], t[:, 1:]),
            "✓ teacher_forcing: matches the reference on all 2 cases")
    rejects(check_teacher_forcing, lambda t: (t[:, 1:], t[:, :-1]), "the two are swapped")
    rejects(check_teacher_forcing, lambda t: (t[:, :-1].numpy(), t[:, 1:].numpy()), "result 0: return a torch.Tensor")
    rejects(check_teacher_forcing, lambda t: (t[:, :-1].float(), t[:, 1:]), "return dtype torch.int64")

    def shifts_in_place(t):  # rolls the learner's own copy of the batch
        labels = t[:, 1:].clone()
        t[:, 1:] = t[:, :-1].clone()
        return t[:, 1:], labels
    rejects(check_teacher_forcing, shifts_in_place, "in place")

    def right(tgt, pad_id):
        return causal_mask(tgt.shape[1]) & (tgt != pad_id)[:, None, None, :]
    accepts(check_decoder_self_mask, right, "✓ decoder_self_mask: matches the reference on all 3 cases")
    rejects(check_decoder_self_mask, lambda t, p: causal_mask(t.shape[1]) & (t != 0)[:, None, None, :], "pad_id=3")
    rejects(check_decoder_self_mask, lambda t, p: ~right(t, p), "polarity flipped")
    rejects(check_decoder_self_mask, lambda t, p: (t != p)[:, None, None, :].expand(-1, 1, t.shape[1], -1),
            "the causal part is missing")
    rejects(check_decoder_self_mask, lambda t, p: right(t, p)[:, 0], "add the head axis")

    rejects(check_length_normalised_score, lambda lp, n, a: lp / n ** a, "divides by length ** alpha")
    rejects(check_length_normalised_score, lambda lp, n, a: lp * ((5 + n) / 6) ** a, "the penalty multiplies")
    rejects(check_length_normalised_score, lambda lp, n, a: lp / ((5 + n) / 6) ** (1 - a), "✗ length_normalised_score")
