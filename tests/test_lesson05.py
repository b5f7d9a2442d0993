"""Lesson 05: the exercise checks (right answers pass, stubs and typical bugs are named) and mask properties."""

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention
from helpers.checks import (
    check_causal_mask,
    check_leaks_future,
    check_masked_attention,
    check_mha_masks,
    check_padding_mask,
)
from helpers.masks import causal_mask, padding_mask


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


def test_check_masked_attention(capsys):
    assert check_masked_attention(scaled_dot_product_attention)
    assert "✓ masked_attention" in capsys.readouterr().out
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
        return scaled_dot_product_attention(q, k, v, ~mask)

    assert not check_masked_attention(naive)
    out = capsys.readouterr().out
    assert "fully masked rows" in out and "contains NaN" in out
    assert not check_masked_attention(zero_then_renormalise)
    out = capsys.readouterr().out
    assert "exp underflows" in out and "values differ" in out  # the clamp turned 0/0 into 0, still wrong
    assert not check_masked_attention(flipped)
    assert "polarity flipped" in capsys.readouterr().out
    assert not check_masked_attention(lambda q, k, v, mask: scaled_dot_product_attention(q, k, v, mask)[0])
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
        (lambda c, p: (~c, ~p), "shape (2, 1, 1, 4), but the reference gives (2, 4)"),
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
    assert "not a single True/False" in capsys.readouterr().out
    assert check_leaks_future(lambda f, x: torch.tensor(right(f, x)))  # a one-element tensor is fine


# --- properties of the masks --------------------------------------------------------------------

@given(T=st.integers(1, 12))
def test_causal_mask_is_the_loop_definition(T):
    m = causal_mask(T)
    assert m.dtype == torch.bool and m.shape == (T, T)
    assert all(m[t, s].item() == (s <= t) for t in range(T) for s in range(T))
    assert m.sum().item() == T * (T + 1) // 2


@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5), extra=st.integers(0, 3))
def test_padding_mask_counts_and_prefix(lengths, extra):
    S = max(max(lengths), 1) + extra
    m = padding_mask(lengths, S)
    assert m.shape == (len(lengths), 1, 1, S) and m.dtype == torch.bool
    assert m.sum(-1).flatten().tolist() == lengths
    assert all(m[b, 0, 0, :n].all() and not m[b, 0, 0, n:].any() for b, n in enumerate(lengths))


@given(B=st.integers(1, 3), H=st.integers(1, 3), T=st.integers(1, 7), D=st.integers(1, 5),
       seed=st.integers(0, 10_000))
def test_causal_attention_equals_torch_is_causal(B, H, T, D, seed):
    q, k, v = tensor(seed, B, H, T, D), tensor(seed + 1, B, H, T, D), tensor(seed + 2, B, H, T, D)
    ours, w = scaled_dot_product_attention(q, k, v, mask=causal_mask(T))
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(ours, theirs, atol=1e-12)
    assert torch.all(w.triu(1) == 0)


@given(T=st.integers(2, 7), seed=st.integers(0, 10_000))
def test_minus_inf_and_renormalise_agree(T, seed):
    scores = tensor(seed, 2, T, T) * 3
    keep = causal_mask(T)
    way1 = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
    p = torch.softmax(scores, -1) * keep
    way2 = p / p.sum(-1, keepdim=True)
    assert torch.allclose(way1, way2, atol=1e-12)


@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 10_000))
def test_combined_mask_matches_torch_mha_with_inverted_masks(lengths, seed):
    T = max(lengths)
    torch.manual_seed(seed)
    ours = MultiHeadAttention(8, 2).double().eval()
    ref = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        ref.out_proj.weight.copy_(ours.w_o.weight)
        ref.out_proj.bias.copy_(ours.w_o.bias)
    x = tensor(seed, len(lengths), T, 8)
    keep = causal_mask(T) & padding_mask(lengths, T)  # (B, 1, T, S); no row is empty: key 0 is real
    out, w = ours(x, x, x, mask=keep)
    out_ref, w_ref = ref(x, x, x, attn_mask=~causal_mask(T), key_padding_mask=~padding_mask(lengths, T)[:, 0, 0],
                         average_attn_weights=False)
    assert torch.allclose(out, out_ref, atol=1e-10) and torch.allclose(w, w_ref, atol=1e-10)


@given(T=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_fully_masked_rows_give_zeros_not_nan(T, seed):
    q, k, v = tensor(seed, 2, T, 4), tensor(seed + 1, 2, T, 4), tensor(seed + 2, 2, T, 3)
    keep = causal_mask(T) & padding_mask([0, T], T)[:, 0]  # item 0: every key is padding
    out, w = scaled_dot_product_attention(q, k, v, mask=keep)
    assert torch.isfinite(out).all() and torch.all(out[0] == 0) and torch.all(w[0] == 0)
    assert torch.allclose(w[1].sum(-1), torch.ones(T, dtype=torch.float64))
