"""Lesson 05's checks: right answers pass with the stored line, stubs say so, wrong answers are named."""

import torch

from helpers.attention import scaled_dot_product_attention
from helpers.checks import (
    check_causal_mask,
    check_leaks_future,
    check_masked_attention,
    check_mha_masks,
    check_padding_mask,
    check_predict_causal_fraction,
)


def tensor(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- the checks ---------------------------------------------------------------------------------

def test_check_causal_mask(capsys):
    assert check_causal_mask(lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T))
    assert "✓ causal_mask" in capsys.readouterr().out
    assert not check_causal_mask(lambda T, S: None)
    assert "not implemented yet" in capsys.readouterr().out
    for bug, words in [
        (lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(), "aligned top-left"),
        (lambda T, S: ~torch.ones(T, S, dtype=torch.bool).tril(S - T), "polarity flipped"),
        (lambda T, S: torch.ones(T, S, dtype=torch.bool).triu(S - T), "see the future"),
        (lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(S - T - 1), "diagonal is missing"),
        (lambda T, S: torch.ones(T, S).tril(S - T), "dtype torch.bool"),
        (lambda T, S: torch.ones(T, S, dtype=torch.bool), "entries differ"),
    ]:
        assert not check_causal_mask(bug)
        assert words in capsys.readouterr().out


def test_check_padding_mask(capsys):
    assert check_padding_mask(lambda ids, pad_id: (ids != pad_id)[:, None, None, :])
    assert "✓ padding_mask" in capsys.readouterr().out
    assert not check_padding_mask(lambda ids, pad_id: None)
    assert "not implemented yet" in capsys.readouterr().out
    for bug, words in [
        (lambda ids, pad_id: (ids == pad_id)[:, None, None, :], "polarity flipped"),
        (lambda ids, pad_id: ids != pad_id, "shape (B, S)"),
        (lambda ids, pad_id: (ids != pad_id)[:, None, :, None], "masks queries"),
        (lambda ids, pad_id: (ids != 0)[:, None, None, :], "ids (2, 5) with pad_id=2"),  # ignores pad_id
        (lambda ids, pad_id: (ids != pad_id).float()[:, None, None, :], "dtype torch.bool"),
    ]:
        assert not check_padding_mask(bug)
        assert words in capsys.readouterr().out


def masked_attention_way2(q, k, v, mask):  # softmax, zero the blocked weights, renormalise: no -inf
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    row_max = torch.where(mask, scores, torch.finfo(scores.dtype).min).amax(-1, keepdim=True)
    e = torch.exp(torch.where(mask, scores - row_max, 0.0)) * mask
    weights = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    return weights @ v, weights


def test_check_masked_attention(capsys):
    assert check_masked_attention(masked_attention_way2)
    assert capsys.readouterr().out == "✓ masked_attention: matches the reference on all 4 cases\n"
    assert not check_masked_attention(scaled_dot_product_attention)  # right values, but way 1 (-inf)
    assert "passes -inf to masked_fill" in capsys.readouterr().out
    assert not check_masked_attention(lambda q, k, v, mask: None)
    assert "not implemented yet" in capsys.readouterr().out

    def naive(q, k, v, mask):  # -inf then torch.softmax: NaN on fully masked rows
        scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, -1)
        return w @ v, w

    def zero_then_renormalise(q, k, v, mask):  # way 2: NaN once exp underflows
        w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) * mask
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
        return w @ v, w

    def flipped(q, k, v, mask):
        return masked_attention_way2(q, k, v, ~mask)

    assert not check_masked_attention(naive)
    out = capsys.readouterr().out
    assert "fully masked rows" in out and "0 / 0 = NaN" in out
    assert not check_masked_attention(zero_then_renormalise)
    out = capsys.readouterr().out
    assert "exp underflows" in out and "max over the allowed scores" in out  # the clamp turned 0/0 into 0
    assert not check_masked_attention(flipped)
    assert "polarity flipped" in capsys.readouterr().out
    assert not check_masked_attention(lambda q, k, v, mask: masked_attention_way2(q, k, v, mask)[0])
    assert "expected a tuple of 2 results" in capsys.readouterr().out


def test_check_mha_masks(capsys):
    assert check_mha_masks(lambda c, p: (~c, ~p[:, 0, 0, :]))
    assert "✓ mha_masks" in capsys.readouterr().out
    assert not check_mha_masks(lambda c, p: None)
    assert "not implemented yet" in capsys.readouterr().out
    for bug, words in [
        (lambda c, p: (c, p[:, 0, 0, :]), "still have the course's polarity"),
        (lambda c, p: (~c, p[:, 0, 0, :]), "key_padding_mask still has"),
        (lambda c, p: (c, ~p[:, 0, 0, :]), "attn_mask still has"),
        (lambda c, p: (~c, ~p), "key_padding_mask must be (B, S)"),
    ]:
        assert not check_mha_masks(bug)
        assert words in capsys.readouterr().out


def test_check_leaks_future(capsys):
    def right(f, x):
        base = f(x)
        for t in range(x.shape[1] - 1):
            changed = x.clone()
            changed[:, t + 1:] = changed[:, t + 1:] + 1.0
            if not torch.allclose(f(changed)[:, : t + 1], base[:, : t + 1], atol=1e-6):
                return True
        return False

    def only_first_position(f, x):  # a typical shortcut: test position 0 against its neighbour only
        changed = x.clone()
        changed[:, 1] = changed[:, 1] + 1.0
        return not torch.allclose(f(changed)[:, 0], f(x)[:, 0])

    state = torch.random.get_rng_state()
    assert check_leaks_future(right)
    assert torch.equal(state, torch.random.get_rng_state())  # the check leaves the learner's RNG alone
    assert "✓ leaks_future" in capsys.readouterr().out
    assert not check_leaks_future(lambda f, x: None)
    assert "not implemented yet" in capsys.readouterr().out
    assert not check_leaks_future(only_first_position)
    assert "adds the LAST input (leaks from far ahead): got False, expected True" in capsys.readouterr().out
    assert not check_leaks_future(lambda f, x: torch.tensor([True, False]))
    assert "return True or False, got Tensor" in capsys.readouterr().out
    assert check_leaks_future(lambda f, x: torch.tensor(right(f, x)))  # a one-element tensor is fine




def test_more_wrong_answers(accepts, rejects):
    def last_input_only(f, x):  # the known hole: perturbs only the last input
        changed = x.clone()
        changed[:, -1] = changed[:, -1] + 1.0
        return not torch.allclose(f(changed)[:, :-1], f(x)[:, :-1], atol=1e-6)
    rejects(check_leaks_future, last_input_only, "misses a leak from an input before the last one")

    def compares_only_last_output(f, x):  # perturbs every position but looks at output t only when t = 0
        changed = x.clone()
        changed[:, 1:] = changed[:, 1:] + 1.0
        return not torch.allclose(f(changed)[:, 0], f(x)[:, 0], atol=1e-6)
    rejects(check_leaks_future, compares_only_last_output, "✗ leaks_future")

    def perturbs_in_place(f, x):
        base = f(x.clone())
        x[:, 1:] += 1.0
        return not torch.allclose(f(x)[:, :1], base[:, :1])
    rejects(check_leaks_future, perturbs_in_place, "in place")
    rejects(check_leaks_future, lambda f, x: 1, "return True or False, got int")

    rejects(check_causal_mask, lambda T, S: torch.ones(T, S).tril(S - T).numpy(), "return a torch.Tensor")
    rejects(check_causal_mask, lambda T, S: torch.ones(T, S, dtype=torch.int64).tril(S - T), "dtype torch.bool")
    rejects(check_padding_mask, lambda ids, pad_id: (ids != pad_id).numpy()[:, None, None, :], "return a torch.Tensor")
    rejects(check_masked_attention, lambda q, k, v, m: masked_attention_way2(q, k, v, torch.ones_like(m)),
            "✗ masked_attention")

    def where_minus_inf(q, k, v, mask):  # way 1 written with torch.where: still -inf
        scores = torch.where(mask, q @ k.mT / q.shape[-1] ** 0.5, float("-inf"))
        w = torch.softmax(scores, -1).nan_to_num(0.0)
        return w @ v, w
    rejects(check_masked_attention, where_minus_inf, "passes -inf to where")

    def no_op_in_place(q, k, v, mask):
        return masked_attention_way2(q, k, v.mul_(1.0), mask)
    accepts(check_masked_attention, no_op_in_place)  # an in-place op that changes nothing is not an edit

    def flips_mask_in_place(q, k, v, mask):
        mask = mask.clone() if mask.dim() == 2 else mask
        out = masked_attention_way2(q, k, v, mask)
        if mask.dim() == 4:
            mask.logical_not_()
        return out
    rejects(check_masked_attention, flips_mask_in_place, "in place")
    rejects(check_mha_masks, lambda c, p: (c.logical_not_(), ~p[:, 0, 0, :]), "in place")
    rejects(check_mha_masks, lambda c, p: ((~c).float(), ~p[:, 0, 0, :]), "result 0: return dtype torch.bool")


def test_predict_causal_fraction(verdict):
    assert not verdict(check_predict_causal_fraction, None)[0]
    ok, line = verdict(check_predict_causal_fraction, 0.55)
    assert ok and line.startswith("✓ predict_causal_fraction: you predicted 0.55; the measured fraction")
    assert not verdict(check_predict_causal_fraction, 0.5)[0]  # "half": the diagonal is forgotten
    assert not verdict(check_predict_causal_fraction, 0.45)[0]  # the triangle without its diagonal
    assert not verdict(check_predict_causal_fraction, 0.25)[0]


def test_masked_attention_finite_fill(accepts, rejects):
    def way1_finite(q, k, v, mask):  # way 1 with -1e9 instead of -inf, empty rows zeroed: not way 2
        scores = (q @ k.mT / q.shape[-1] ** 0.5).masked_fill(~mask, -1e9)
        w = torch.softmax(scores, -1) * mask.any(-1, keepdim=True)
        return w @ v, w
    rejects(check_masked_attention, way1_finite, "way 1 with a large negative fill")

    def lowest_then_exp(q, k, v, mask):  # the same with finfo.min and exp: the exponential sees the fill
        scores = torch.where(mask, q @ k.mT / q.shape[-1] ** 0.5, torch.finfo(q.dtype).min)
        e = torch.exp(scores - scores.amax(-1, keepdim=True)) * mask
        w = e / e.sum(-1, keepdim=True).clamp_min(1e-30)
        return w @ v, w
    rejects(check_masked_attention, lowest_then_exp, "feeds scores of -10000 or less to exp")

    def masked_fill_after_exp(q, k, v, mask):  # way 2: a fill only for the row max, zeros after exp
        scores = q @ k.mT / q.shape[-1] ** 0.5
        row_max = scores.masked_fill(~mask, torch.finfo(q.dtype).min).amax(-1, keepdim=True)
        e = (scores - row_max).masked_fill(~mask, 0.0).exp().masked_fill(~mask, 0.0)
        w = e / e.sum(-1, keepdim=True).clamp_min(1e-30)
        return w @ v, w
    accepts(check_masked_attention, masked_fill_after_exp)


def test_predict_causal_fraction_names_the_classic_slips(verdict):
    for wrong, words in [(0.45, "leaves out the diagonal"), (0.5, "not quite half"), (55, "number of pairs kept"),
                         (0.3, "count the keys of each row")]:
        ok, line = verdict(check_predict_causal_fraction, wrong)
        assert not ok and words in line, line
    assert verdict(check_predict_causal_fraction, 0.55)[0]
    assert verdict(check_predict_causal_fraction, 11 / 20)[0]


def test_masked_attention_overflow_is_not_called_an_underflow(rejects):
    def times_mask(q, k, v, mask):  # the max over the allowed scores, but every exp, then * mask
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        m = mask.expand_as(s)
        e = torch.exp(s - s.masked_fill(~m, float("-inf")).amax(-1, keepdim=True)) * m
        w = e / e.sum(-1, keepdim=True)
        return w @ v, w
    line = rejects(check_masked_attention, times_mask, "inf * 0 = NaN")
    assert "your max includes the blocked scores" not in line
